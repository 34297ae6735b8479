"""Streamed fragments: Streaming DiLoCo's server (``fedlm.strategies.fragments`` has
the algorithm, ``fedlm.worker.streaming`` the worker's side).

A round is a synchronous round at global version v: each job trains
``segment_steps(H_w, P, v)`` inner steps and reports fragment ``v mod P``, where H_w is
its worker's outer step as the run's ``local_steps`` sizes it (``fixed``: H; ``fill``,
``dylu``: shown fragment rounds, ``fedlm.servers.fragment_steps``). What it
carries is what its worker lacks: the whole model on the worker's first job;
afterwards only the global fragments changed since the version its state was
made from (normally the one fragment the previous round synchronised), to be
mixed in at inner step τ. ``what_to_send`` is the rule, applied with the base
version of the worker's last accepted job (``Server.seen``: a run and its replay
accept the same jobs in the same order, so both send the same).

Timing (virtual clock): the exchange a job waits for is the previous round's
(its fragment's upload and the new fragments' download, or their all-reduce),
overlapped by the job's first τ steps (``JobTimer.overlapped_timing``). The
last round's exchange is not timed: the run ends when its version exists.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from fedlm import presets
from fedlm.config import Config
from fedlm.errors import require
from fedlm.job import JobSpec
from fedlm.params import num_bytes
from fedlm.servers.fragment_steps import FragmentRoundSteps
from fedlm.servers.protocol import JobClock, Sent, Server
from fedlm.sim import wire_sizes
from fedlm.strategies.base import DROPPED, Strategy, Update
from fedlm.strategies.traits import traits
from fedlm.strategies.fragments import (Streaming, changed_since, fragment_names,
                                        round_fragment, segment_steps)


def what_to_send(streaming: Streaming, groups: list[list[str]], names: list[str],
                 seen: int | None, version: int, flushing: bool = False
                 ) -> tuple[list[str], dict[str, int]]:
    """The tensor names a job from ``version`` carries, and its spec's streaming
    fields, for a worker whose state was made from version ``seen`` (None: it has
    none yet, a first job). A flushing round's job trains no step: it mixes what it
    is sent in at once and reports its fragment."""
    fragment = round_fragment(version, streaming.fragments)
    if seen is None:
        return list(names), {"fragment": fragment, "mix_step": -1}
    changed = changed_since(seen, version, streaming.fragments)
    sent = [n for p in changed for n in groups[p]]
    order = {n: i for i, n in enumerate(names)}
    sent.sort(key=order.__getitem__)
    if not sent:
        mix_step = -1  # nothing of it changed: no mix-in
    elif flushing:
        mix_step = 0
    else:
        mix_step = streaming.overlap
    return sent, {"fragment": fragment, "mix_step": mix_step}


def flushing(cfg: Config, streaming: Streaming, version: int) -> bool:
    """Whether the round at ``version`` is one of the last P - 1: after ``updates``
    outer steps, the fragments synchronised before the last round are brought in
    once more, with no inner step, so that the final model holds every worker's
    steps on every fragment (as DiLoCo's last round does)."""
    return version >= cfg.updates * streaming.fragments


class StreamedServer(Server):
    """Streaming DiLoCo's server: a synchronous round per fragment, each job sent the
    fragments its worker lacks and reporting one fragment (``what_to_send``).

    Each fragment has an instance of the strategy of its own, which sees only that
    fragment's tensors (optax's ``multi_transform``, by fragment): round v is fragment
    v mod P's, so its dispatches, replies and lost jobs go to that instance, and the
    new fragment it returns is put back into the whole model. The strategy itself
    knows nothing of fragments."""

    @classmethod
    def check(cls, cfg: Config, strategy: type[Strategy]) -> None:
        """Streaming rounds' rules (the ``[stream]`` section is this kind's): a synchronous
        strategy, fragments that cut the model's blocks and H, an overlap shorter than a
        round, no shared server link (its exchanges are timed without)."""
        stream = Streaming.of_config(cfg)
        name = cfg.server.kind or "streamed"
        require(stream is not None, "server", name,
                "has streaming rounds to run: set stream.fragments (or stream.overlap)")
        require(traits(strategy).synchronous, "stream.fragments", stream.fragments,
                f"streaming rounds need a synchronous strategy (diloco, fedavg), "
                f"not {cfg.strategy!r}")
        blocks = presets.PRESETS[cfg.model][0]
        require(stream.fragments <= blocks, "stream.fragments", stream.fragments,
                f"must be at most the {blocks} blocks of layers of model {cfg.model!r}")
        shortest = cfg.inner.steps // stream.fragments
        require(shortest >= 1, "stream.fragments", stream.fragments,
                f"must be at most inner.steps ({cfg.inner.steps})")
        require(stream.overlap < shortest, "stream.overlap", stream.overlap,
                f"must be less than the {shortest} inner steps of a round "
                f"(inner.steps {cfg.inner.steps} / stream.fragments {stream.fragments})")
        n = cfg.network
        require(not (n.server_down > 0 or n.server_up > 0 or n.daily_amplitude > 0),
                "stream.fragments", stream.fragments, "streaming rounds are timed without a "
                "shared server link or daily cycle: drop network.server_down, server_up and "
                "daily_amplitude")

    def __init__(self, cfg: Config, strategy: Strategy) -> None:
        super().__init__(cfg, strategy)
        self.streaming = Streaming.of_config(cfg)
        # the run's job sizes, shown fragment rounds: a worker's outer step of H_w steps,
        # split into P segments as the paper splits H
        self.policy = FragmentRoundSteps(self.policy, self.streaming.fragments,
                                         self.streaming.overlap)
        self.parts = [strategy] + [self.new_strategy()
                                   for _ in range(self.streaming.fragments - 1)]

    def start_strategy(self, params, fleet: list) -> None:
        """Each fragment's instance starts on that fragment's tensors."""
        self.names = list(params)
        self.groups = fragment_names(self.names, self.streaming.fragments)
        parts = [_part(params, g) for g in self.groups]
        for strategy, part in zip(self.parts, parts):
            strategy.on_fleet(self.facts(fleet))
            strategy.start(part, num_workers=len(fleet))
        self.encoded_bytes = [wire_sizes.encoded_bytes(p, self.cfg.network) for p in parts]

    def _of(self, version: int) -> tuple[int, Strategy]:
        """The fragment round ``version`` synchronises, and its strategy instance."""
        p = round_fragment(version, self.streaming.fragments)
        return p, self.parts[p]

    def _whole(self, fragment) -> "OrderedDict":
        """The evaluated model with ``fragment``'s new tensors put in."""
        return OrderedDict((k, fragment[k] if k in fragment else v)
                           for k, v in self.params.items())

    @property
    def versions_per_update(self) -> int:
        """An outer step is P rounds, one a fragment."""
        return self.streaming.fragments

    def versions_wanted(self, updates: int) -> int:
        """... and the run ends with P - 1 rounds of no steps that bring every
        fragment in (``flushing``)."""
        return updates * self.streaming.fragments + self.streaming.fragments - 1

    def describe(self) -> str:
        s = self.streaming
        return f"streaming: {s.fragments} fragment(s), overlap {s.overlap}, mix {s.mix:g}"

    def flushing(self, version: int) -> bool:
        return flushing(self.cfg, self.streaming, version)

    def wants_job(self, worker: int, version: int) -> bool:
        return self._of(version)[1].wants_job(worker, version=version)

    def dispatched(self, worker: int, version: int) -> None:
        self._of(version)[1].on_dispatch(worker, version=version)

    def take(self, update: Update):
        p, strategy = self._of(update.base_version)
        new = strategy.on_update(update, _part(self.params, self.groups[p]))
        return new if new is None or new is DROPPED else self._whole(new)

    def lose(self, worker: int, *, job_id: int, reason: str):
        p, strategy = self._of(self.version)  # a round's jobs are all of its version
        new = strategy.on_job_lost(worker, job_id=job_id, reason=reason,
                                   params=_part(self.params, self.groups[p]))
        return None if new is None else self._whole(new)

    def job_steps(self, worker: int, version: int) -> int:
        if self.flushing(version):
            return 0
        outer_step = self.policy.local_steps(worker)  # H_w (fixed: H)
        segment = segment_steps(outer_step, self.streaming.fragments, version)
        return max(1, segment) if outer_step >= 1 else 0  # sized any steps: one at least

    def sends_empty_job(self, version: int) -> bool:
        return self.flushing(version)

    def send(self, job: JobSpec, start) -> Sent:
        """The fragments the worker lacks, to mix in τ steps into the job."""
        sent, fields = what_to_send(self.streaming, self.groups, self.names,
                                    self.seen.get(job.worker), job.base_version,
                                    self.flushing(job.base_version))
        if fields["mix_step"] > 0:  # a job shorter than τ + 1 steps (its policy's) hides less
            fields["mix_step"] = min(fields["mix_step"], job.local_steps - 1)
        job = replace(job, **fields)
        payload = OrderedDict((n, start[n]) for n in sent)
        return Sent(job, payload, num_bytes(payload) if sent else 0,
                    self.encoded_bytes[job.fragment])

    def timing(self, sent: Sent, events: JobClock, index: int):
        # the exchange it waits for starts with the upload of its worker's last report
        seen = self.seen.get(sent.job.worker)
        prev_up = (self.encoded_bytes[round_fragment(seen, self.streaming.fragments)]
                   if seen is not None else 0)
        return events.overlapped_timing(sent.job.worker, sent.job.local_steps, sent.down,
                                        prev_up, sent.job.mix_step)

    def reference(self, job: JobSpec):
        """The global tensors of the fragment the reply reports."""
        return _part(self.params, self.groups[job.fragment])

    def state_dict(self) -> dict:
        return {**super().state_dict(), "parts": [p.state_dict() for p in self.parts]}

    def load_state_dict(self, state: dict, checkpoint: dict | None = None) -> None:
        super().load_state_dict(state, checkpoint)
        parts = state.get("parts") or _split_legacy(state["strategy"], len(self.parts),
                                                    round_fragment(state["version"],
                                                                   len(self.parts)))
        for strategy, st in zip(self.parts, parts):
            strategy.load_state_dict(st)


def _part(tensors, names: list[str]) -> "OrderedDict":
    """The tensors of ``names``, in that order."""
    return OrderedDict((k, tensors[k]) for k in names)


def _split_legacy(state: dict, fragments: int, current: int) -> list[dict]:
    """A checkpoint of an older fedlm kept one strategy with a list of per-fragment
    optimizer states: the instances' states, the current round's with its replies."""
    quiet = {"dispatched": [], "results": {}, "dropped": []}
    return [{**state, "opt_state": state["opt_state"][p], **({} if p == current else quiet)}
            for p in range(fragments)]
