"""The server side of a run, as the engine, replay and resume see it: one protocol.

    start(params, fleet)           the initial model; the workers' profiles
    worker_links(fleet)            the links a worker's jobs are timed over
    wants_job(w, version)          whether free w gets a job now (the strategy's say)
    job_steps(w, version, policy)  inner steps of w's next job (0: none)
    sends_empty_job(version)       whether a job of 0 steps is still sent
    dispatched(w, version)         a job of w starts now
    start_of(w)                    the model a job of w starts from
    send(job, start, seen)    ->   Sent: the job as sent, its payload, its bytes
    timing(sent, events, index)    its durations on the event clock
    reference(job)                 what its reply's outer gradient is shaped like
    update / apply / lose          a reply handed to the strategy (or a lost job)
    accepted(w, job)               w's reply was taken (its state is now job's)
    take_transfers() / deliver(k)  messages between servers, timed by the engine
    new_version(params)            the evaluated model becomes version v + 1
    versions_per_update            versions one of the run's `updates` makes
    versions_wanted(updates)       the versions a run of ``updates`` makes in all
    resend(flight, base_params)    what a job in flight carried (resume)

``Server`` is the protocol and the one-server implementation every flat strategy
runs on: a job starts from the global model and reports all of it. Other kinds
(``fedlm.servers.streamed``: a fragment per round; ``fedlm.servers.regions``: a
server in every region and a global one) override what differs. The engine and
replay drive every kind through these calls alone, so a run and its replay hand
updates, lost jobs, transfers and new versions to the strategy the same way, and
a new family plugs in as a strategy that names its server (``Strategy.server``).

The server owns the evaluated (and hashed) params, their version, the strategy
and the numbering of the updates handed to it (``seq``, with those it still
holds); it computes each update's staleness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedlm.config import Config
from fedlm.job import JobSpec
from fedlm.params import num_bytes
from fedlm.sim import wire_sizes
from fedlm.strategies.base import Strategy, Update


@dataclass(frozen=True)
class Sent:
    """A job as the server sends it."""

    job: JobSpec  # with any fields the server sets on it
    payload: Any  # the tensors sent
    down: int  # bytes sent down
    up: int  # bytes of its reply


class Server:
    """One server: every job starts from the global model and reports all of it."""

    # whether a job in flight keeps the model it started from (resume sends it again);
    # else it started from a global version, which the engine keeps while it is needed
    keeps_job_starts = False
    # whether the config's network may give this kind a shared server link
    shared_link = True

    def __init__(self, cfg: Config, strategy: Strategy) -> None:
        self.cfg, self.strategy = cfg, strategy
        self.params: Any = None
        self.version = 0
        self.seq = 0  # updates handed to the strategy so far
        self.held: list[int] = []  # their seqs not yet in a version
        self.seen: dict[int, int] = {}  # worker -> base version of its last accepted job

    # -- setup -----------------------------------------------------------------------
    def worker_links(self, fleet: list) -> list:
        """The profiles a worker's jobs are timed over: its link to this server."""
        return fleet

    def start(self, params, fleet: list) -> None:
        self.params = params
        self.model_bytes = num_bytes(params)  # fp32, as sent down
        self.up_bytes = wire_sizes.encoded_bytes(params, self.cfg.network)
        self.start_strategy(params, fleet)

    def start_strategy(self, params, fleet: list) -> None:
        """The strategy's ``start`` (a kind with more to set up first overrides this)."""
        self.strategy.start(params, num_workers=len(fleet))

    @property
    def versions_per_update(self) -> int:
        """Versions one of the run's ``updates`` (and ``eval.every``) counts."""
        return 1

    def versions_wanted(self, updates: int) -> int:
        return updates * self.versions_per_update

    def describe(self) -> str:
        """What a run of this kind is, in a few words ("" for one server)."""
        return ""

    # -- jobs --------------------------------------------------------------------------
    def wants_job(self, worker: int, version: int) -> bool:
        return self.strategy.wants_job(worker, version=version)

    def job_steps(self, worker: int, version: int, policy) -> int:
        return policy.local_steps(worker)

    def sends_empty_job(self, version: int) -> bool:
        return False

    def dispatched(self, worker: int, version: int) -> None:
        self.strategy.on_dispatch(worker, version=version)

    def start_of(self, worker: int):
        """The model a job of ``worker`` starts from now."""
        return self.params

    def send(self, job: JobSpec, start, seen: int | None) -> Sent:
        """``job`` from ``start``, for a worker whose state came from a job of global
        version ``seen`` (None: a first job)."""
        return Sent(job, start, self.model_bytes, self.up_bytes)

    def timing(self, sent: Sent, events, index: int):
        return events.timing(sent.job.worker, sent.job.local_steps, index)

    def reference(self, job: JobSpec):
        """Tensors shaped as the reply's outer gradient must be."""
        return self.params

    def resend(self, flight, base_params: dict):
        """What a job in flight at a checkpoint carried (resume sends it again)."""
        if flight.start is not None:
            return flight.start
        start = base_params[flight.job.base_version]
        return self.send(flight.job, start, self.seen.get(flight.job.worker)).payload

    # -- replies -------------------------------------------------------------------------
    def staleness(self, worker: int, base_version: int) -> int:
        return self.version - base_version

    def update(self, *, worker: int, job_id: int, base_version: int, outer_grad,
               tokens: int, local_steps: int) -> Update:
        """The strategy's view of a finished job, with its staleness now."""
        return Update(worker=worker, job_id=job_id, base_version=base_version,
                      outer_grad=outer_grad, tokens=tokens, local_steps=local_steps,
                      staleness=self.staleness(worker, base_version))

    def accepted(self, worker: int, job: JobSpec) -> None:
        self.seen[worker] = job.base_version

    def apply(self, update: Update):
        self.held.append(self.seq)
        self.seq += 1
        return self.take(update)

    def take(self, update: Update):
        """The strategy takes ``update``: new evaluated params, or None."""
        return self.strategy.on_update(update, self.params)

    def lose(self, worker: int, *, job_id: int, reason: str):
        return self.strategy.on_job_lost(worker, job_id=job_id, reason=reason,
                                         params=self.params)

    def take_transfers(self) -> list:
        """Messages between servers queued since the last call (``Transfer``s: key,
        kind, region, nbytes); each comes back through ``deliver`` when it arrives."""
        return []

    def deliver(self, key: int) -> tuple[Any | None, int]:
        """Transfer ``key`` arrived: (new evaluated params or None, its staleness)."""
        raise KeyError(f"no transfer {key}: {type(self).__name__} sends none")

    def new_version(self, params) -> list[int]:
        """``params`` become the next version; returns the seqs of the updates in it."""
        self.params = params
        self.version += 1
        seqs, self.held = self.held, []
        return seqs

    # -- state -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"params": self.params, "version": self.version, "seq": self.seq,
                "held": list(self.held), "strategy": self.strategy.state_dict(),
                "seen": dict(self.seen)}

    def load_state_dict(self, state: dict, checkpoint: dict | None = None) -> None:
        """``state`` from ``state_dict``; ``checkpoint``: the engine's whole checkpoint,
        for parts that older versions of fedlm kept beside the model."""
        self.params, self.version = state["params"], state["version"]
        self.seq, self.held = state["seq"], list(state["held"])
        self.strategy.load_state_dict(state["strategy"])
        seen = state.get("seen", (checkpoint or {}).get("stream", {}).get("seen", {}))
        self.seen = {int(w): int(v) for w, v in seen.items()}
