"""What flows through the engine: replies, events, jobs in flight, progress.

Events are typed: the loop handles a ``JobDone`` (a job to hand on: its result,
its error, or the deadline it missed), a ``BackOnline`` (an offline worker may
work again), a ``Delivery`` (a message between servers arrived) or a ``Wake`` (a
wake-up the server kind asked for is due). Whatever
produces them (``fedlm.engine.events``) decides the order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fedlm.sim.fleet import JobTiming
from fedlm.job import JobResult, JobSpec


class EngineError(RuntimeError):
    """The run cannot go on (the message says why)."""


class Interrupted(EngineError):
    """The user asked the run to stop (Ctrl-C, SIGTERM)."""


class Diverged(EngineError):
    """The global model's validation loss blew up (``fedlm.engine.divergence``): the
    run stops, marked ``diverged``; the message is one line with a hint."""

    def __init__(self, message: str, *, version: int) -> None:
        super().__init__(message)
        self.version = version


class Transport(Protocol):
    """Runs jobs somewhere and hands back their replies in any order."""

    def submit(self, job: JobSpec, params) -> None: ...

    def collect(self, timeout: float) -> list[JobResult]:
        """Replies that have arrived; waits up to ``timeout`` seconds for at least one."""
        ...


@dataclass(frozen=True)
class InFlight:
    """A dispatched job the engine waits for."""

    job: JobSpec
    t_dispatch: float
    timing: JobTiming | None  # virtual durations; None on the wall clock
    index: int  # the worker's how-many-th job (seeds its data and faults)
    deadline: float  # the job is lost if it has not finished by then
    expires: bool = False  # virtual clock: it will miss its deadline (its event is the deadline)
    # the model it started from, if its server keeps it (resume sends it again)
    start: object = None
    # a fleet that changes over time: its worker goes away then, mid-job
    departs: float | None = None


@dataclass(frozen=True)
class JobDone:
    """A job to hand on: ``reply`` is its result, or an error (its own, or a missed
    deadline: ``JobResult.error`` starting with "deadline")."""

    job_id: int
    reply: JobResult


@dataclass(frozen=True)
class BackOnline:
    """Worker ``worker``'s offline period is over."""

    worker: int


@dataclass(frozen=True)
class Delivery:
    """A message between servers (``fedlm.servers.Message``), ``key``, has arrived."""

    key: int


@dataclass(frozen=True)
class Wake:
    """A wake-up a server kind asked for (``fedlm.servers.Alarm``), ``key``, is due."""

    key: int


Event = JobDone | BackOnline | Delivery | Wake


@dataclass(frozen=True)
class Progress:
    version: int
    target: int
    virtual_time: float
    jobs: int
    tokens: int
    perplexity: float | None
    local_steps: int  # inner steps of all updates received
    budget: int  # local_step_budget (0: none)


def departed(job_id: int, flight: InFlight, wall_arrival: float) -> JobResult:
    """The reply the engine acts on for a job whose worker went away before it ended."""
    return JobResult.failed(job_id, f"departed: the worker went away at "
                            f"{flight.departs:.1f} s, mid-job", wall_arrival)


def missed_deadline(job_id: int, flight: InFlight, wall_arrival: float) -> JobResult:
    """The reply the engine acts on for a job that missed its deadline."""
    return JobResult.failed(job_id, f"deadline: no reply within "
                            f"{flight.deadline - flight.t_dispatch:.1f} s", wall_arrival)
