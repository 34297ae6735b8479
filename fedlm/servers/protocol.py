"""The one-server kind (``server = "one"``): every job starts from the global model and
reports all of it. It answers the contract's hooks (``fedlm.servers.kind.ServerKind``)
with finer steps of its own, which other kinds built on it (``streamed``, ``regions``,
the plug-ins) override where they differ:

    start        -> start_strategy(params, fleet)
    next_job     -> job_steps(w, v) (its policy's H), sends_empty_job(v)
    dispatch     -> start_of(w), send(job, start), timing(sent, events, index),
                    dispatched(w, v)
    accept       -> accepted(w, job), staleness(w, base_version)
    take, lose   -> the strategy's on_update, on_job_lost
    state        the strategy's, ``seen``, the queued messages, and ``state_fields``

It composes its strategy and calls it only through the ``Strategy`` base class's
methods; a kind that composes several makes them with ``new_strategy`` and tells each
the fleet it serves with ``facts``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from fedlm.job import JobSpec
from fedlm.params import num_bytes
from fedlm.servers.kind import JobClock, Message, Sent, ServerKind, Serves  # noqa: F401
from fedlm.sim import link_codecs, wire_sizes
from fedlm.strategies.base import FleetFacts, Strategy, Update
from fedlm.strategies.rounds import rounds_cut_by_server


class Server(ServerKind):
    """One server: every job starts from the global model and reports all of it."""

    def __init__(self, cfg, strategy: Strategy) -> None:
        super().__init__(cfg, strategy)
        self.seen: dict[int, int] = {}  # worker -> base version of its last accepted job

    # -- setup -----------------------------------------------------------------------
    def start(self, params, fleet: list) -> None:
        self.params = params
        self.model_bytes = num_bytes(params)  # fp32, as sent down
        self.up_bytes = wire_sizes.encoded_bytes(params, self.cfg.network)
        self.choose_slow_links(params, fleet)
        self.start_strategy(params, fleet)

    def choose_slow_links(self, params, fleet: list) -> None:
        """The workers whose uploads ``network.slow_compression`` encodes, each with its
        bytes (``uploads``: what ``send`` and the job sizes see)."""
        slow = self.cfg.network.slow_compression
        if slow:
            workers = link_codecs.slow_workers(fleet, self.model_bytes, self.up_bytes,
                                               self.cfg.inner.steps)
            encoded = wire_sizes.encoded_bytes(params, replace(self.cfg.network, compression=slow))
            self.uploads = dict.fromkeys(workers, encoded)

    def start_strategy(self, params, fleet: list) -> None:
        """The strategy's ``start`` (a kind with more to set up first overrides this)."""
        if self.serves.cuts_rounds:  # before it hears of the fleet (``outer.late``'s check)
            rounds_cut_by_server(self.strategy)
        self.strategy.on_fleet(self.facts(fleet))
        self.strategy.start(params, num_workers=len(fleet))

    def new_strategy(self, outer: dict | None = None) -> Strategy:
        """Another instance of the run's strategy (``outer``: other settings), for a kind
        that composes several (a fragment's, a region's, the global server's)."""
        from fedlm.strategies.registry import build_strategy

        return build_strategy(self.cfg.strategy, self.cfg.outer if outer is None else outer)

    def facts(self, fleet: list) -> FleetFacts:
        """What a strategy of this server may know of the fleet (``Strategy.on_fleet``)."""
        cfg = self.cfg

        def data_sizes() -> list[int] | None:  # the corpus is read only if it is asked for
            from fedlm.shards import shard_sizes

            return shard_sizes(cfg) if cfg.data.shard_choice == "fixed" else None
        return FleetFacts(cfg.seed, tuple(p.step_time for p in fleet), cfg.inner.steps,
                          data_sizes)

    @property
    def versions_per_update(self) -> int:
        """Versions one of the run's ``updates`` (and ``eval.every``) counts."""
        return 1

    def versions_wanted(self, updates: int) -> int:
        return updates * self.versions_per_update

    # -- jobs --------------------------------------------------------------------------
    def wants_job(self, worker: int, version: int) -> bool:
        return self.strategy.wants_job(worker, version=version)

    def next_job(self, worker: int, version: int,
                 allow: Callable[[int], int] = lambda steps: steps) -> int | None:
        steps = allow(self.job_steps(worker, version))
        return steps if steps > 0 or self.sends_empty_job(version) else None

    def dispatch(self, job: JobSpec, events: JobClock | None = None, index: int = 0) -> Sent:
        sent = self.send(job, self.start_of(job.worker))
        timing = self.timing(sent, events, index) if events is not None else None
        self.dispatched(job.worker, job.base_version)
        return replace(sent, timing=timing,
                       keep=sent.payload if self.serves.keeps_job_starts else None)

    def job_steps(self, worker: int, version: int) -> int:
        return self.policy.local_steps(worker)

    def sends_empty_job(self, version: int) -> bool:
        return False

    def dispatched(self, worker: int, version: int) -> None:
        self.strategy.on_dispatch(worker, version=version)

    def start_of(self, worker: int):
        """The model a job of ``worker`` starts from now."""
        return self.params

    def send(self, job: JobSpec, start) -> Sent:
        """``job`` from ``start`` (its worker's state came from a job of global version
        ``self.seen.get(job.worker)``; None: a first job)."""
        if job.worker in self.uploads:  # its link is slow: fewer bytes up
            return Sent(replace(job, compression=self.cfg.network.slow_compression), start,
                        self.model_bytes, self.uploads[job.worker])
        return Sent(job, start, self.model_bytes, self.up_bytes)

    def timing(self, sent: Sent, events: JobClock, index: int):
        """How long ``sent``'s job takes on the event source (``JobClock``: what a kind
        may ask of it); None on the wall clock, where only the reply says."""
        if sent.job.compression:  # a slow link's encoding: its own bytes up
            return events.timing(sent.job.worker, sent.job.local_steps, index, up_bytes=sent.up)
        return events.timing(sent.job.worker, sent.job.local_steps, index)

    def reference(self, job: JobSpec):
        """Tensors shaped as the reply's outer gradient must be."""
        return self.params

    # -- replies -------------------------------------------------------------------------
    def accept(self, job: JobSpec) -> int:
        self.accepted(job.worker, job)
        return self.staleness(job.worker, job.base_version)

    def staleness(self, worker: int, base_version: int) -> int:
        return self.version - base_version

    def accepted(self, worker: int, job: JobSpec) -> None:
        self.seen[worker] = job.base_version

    def take(self, update: Update):
        """The strategy takes ``update``: new evaluated params, or None."""
        return self.strategy.on_update(update, self.params)

    def lose(self, worker: int, *, job_id: int, reason: str):
        return self.strategy.on_job_lost(worker, job_id=job_id, reason=reason,
                                         params=self.params)

    # -- state -------------------------------------------------------------------------
    # a kind's own attributes that a checkpoint keeps as they are (dicts, lists, tensors)
    state_fields: tuple[str, ...] = ()

    def state_dict(self) -> dict:
        return {"params": self.params, "version": self.version,
                "strategy": self.strategy.state_dict(), "seen": dict(self.seen),
                "outbox": list(self.outbox), "next_key": self.next_key,
                **{k: getattr(self, k) for k in self.state_fields}}

    def load_state_dict(self, state: dict, checkpoint: dict | None = None) -> None:
        """``state`` from ``state_dict``; ``checkpoint``: the engine's whole checkpoint,
        for parts that older versions of fedlm kept beside the model."""
        self.params = state["params"]
        self.version = state["version"]
        self.strategy.load_state_dict(state["strategy"])
        seen = state.get("seen", (checkpoint or {}).get("stream", {}).get("seen", {}))
        self.seen = {int(w): int(v) for w, v in seen.items()}
        # a checkpoint of a kind that sends no messages, or of an older fedlm, has none
        self.outbox = list(state.get("outbox", []))
        self.next_key = state.get("next_key", 0)
        self.alarms = []  # asked at start again: the engine's checkpoint has those it set
        for k in self.state_fields:
            setattr(self, k, state[k])
