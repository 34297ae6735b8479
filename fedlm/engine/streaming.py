"""Streaming DiLoCo rounds as the engine (and replay) hand them out
(``fedlm.strategies.fragments`` has the algorithm, ``fedlm.worker.streaming`` the
worker's side).

A round is a synchronous round at global version v: each job trains
``segment_steps(H, P, v)`` inner steps and reports fragment ``v mod P``. What it
carries is what its worker lacks: the whole model on the worker's first job;
afterwards only the global fragments changed since the version its state was
made from (normally the one fragment the previous round synchronised), to be
mixed in at inner step τ. ``what_to_send`` is the rule; the engine applies it
with the base version of each worker's last accepted job, replay with the
same number read from the jobs table, so both send the same.

Timing (virtual clock): the exchange a job waits for is the previous round's
(its fragment's upload and the new fragments' download, or their all-reduce),
overlapped by the job's first τ steps (``JobTimer.streaming_timing``). The
last round's exchange is not timed: the run ends when its version exists.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from fedlm.config import Config
from fedlm.job import FRESH, JobSpec
from fedlm.params import num_bytes
from fedlm.sim import wire_sizes
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
    mix_step = (0 if flushing else streaming.overlap) if sent else -1
    return sent, {"fragment": fragment, "mix_step": mix_step}


def flushing(cfg: Config, streaming: Streaming, version: int) -> bool:
    """Whether the round at ``version`` is one of the last P - 1: after ``updates``
    outer steps, the fragments synchronised before the last round are brought in
    once more, with no inner step, so that the final model holds every worker's
    steps on every fragment (as DiLoCo's last round does)."""
    return version >= cfg.updates * streaming.fragments


class StreamRounds:
    """The engine's streaming bookkeeping: which version each worker's state is from."""

    def __init__(self, cfg: Config, streaming: Streaming) -> None:
        self.cfg, self.streaming = cfg, streaming
        self.seen: dict[int, int] = {}  # worker -> base version of its last accepted job

    @classmethod
    def of(cls, cfg: Config) -> "StreamRounds | None":
        streaming = Streaming.from_outer(cfg.outer)
        return None if streaming is None else cls(cfg, streaming)

    def start(self, params) -> None:
        self.names = list(params)
        self.groups = fragment_names(self.names, self.streaming.fragments)
        parts = [OrderedDict((n, params[n]) for n in g) for g in self.groups]
        self.fragment_bytes = [num_bytes(p) for p in parts]  # fp32, as sent down
        self.encoded_bytes = [wire_sizes.encoded_bytes(p, self.cfg.network) for p in parts]

    def flushing(self, version: int) -> bool:
        return flushing(self.cfg, self.streaming, version)

    def steps(self, version: int) -> int:
        if self.flushing(version):
            return 0
        return segment_steps(self.cfg.inner.steps, self.streaming.fragments, version)

    def plan(self, worker: int, version: int, params):
        """(payload, spec fields, bytes down, bytes of the previous round's upload)."""
        seen = self.seen.get(worker)
        sent, fields = what_to_send(self.streaming, self.groups, self.names, seen, version,
                                    self.flushing(version))
        payload = OrderedDict((n, params[n]) for n in sent)
        # the exchange it waits for starts with the upload of its worker's last report
        prev_up = (self.encoded_bytes[round_fragment(seen, self.streaming.fragments)]
                   if seen is not None else 0)
        return payload, fields, num_bytes(payload) if sent else 0, prev_up

    def dispatch(self, job: JobSpec, params, events):
        """A round's job as the engine sends it: (job with its streaming fields, payload,
        bytes down, bytes up, its timing from ``events`` (None on the wall clock))."""
        payload, fields, down, prev_up = self.plan(job.worker, job.base_version, params)
        job = replace(job, **fields)
        timing = events.streaming_timing(job.worker, job.local_steps, down, prev_up,
                                         job.mix_step)
        return job, payload, down, self.encoded_bytes[job.fragment], timing

    def reference(self, fragment: int, params):
        """The global tensors a reply's outer gradient must match."""
        return OrderedDict((n, params[n]) for n in self.groups[fragment])

    def accepted(self, worker: int, base_version: int) -> None:
        self.seen[worker] = base_version

    def state_dict(self) -> dict:
        return {"seen": dict(self.seen)}

    def load_state_dict(self, st: dict) -> None:
        self.seen = {int(w): int(v) for w, v in st["seen"].items()}


def seen_versions(jobs: dict, job: dict) -> int | None:
    """Replay's ``seen``: the base version of the job a job's state came from."""
    prev = job["prev_job"]
    return None if prev is None or prev == FRESH else jobs[prev]["base_version"]
