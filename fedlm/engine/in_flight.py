"""The jobs in flight: dispatched, not yet handed on (done or lost).

One owner, ``InFlightJobs``: the loop adds a job when it dispatches it and pops it
when it takes the job's event; the other parts get it passed to them and ask it
what they need (is this job still waited for, which one missed its deadline,
which jobs were handed out together). Each query is answered from counts and
indices kept as jobs come and go, not by a scan of every job in flight: a fleet
of 100,000 workers has as many jobs in flight, and the loop asks at every event.
"""

from __future__ import annotations

import heapq
from typing import Iterator

from fedlm.engine.types import InFlight


class InFlightJobs:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._jobs: dict[int, InFlight] = {}  # job id -> its flight, in dispatch order
        self._steps = 0  # inner steps of the jobs in flight
        self._bases: dict[int, int] = {}  # base version -> jobs in flight started from it
        # jobs handed out at the same moment from the same model: (t_dispatch, base) -> ids
        self._cohorts: dict[tuple[float, int], set[int]] = {}
        # Only asked on the wall clock (the virtual clock has these times as events):
        # when each job's deadline passes, and when its worker goes away (a fleet that
        # changes over time; ``InFlight.departs``)
        self._deadlines = _Due(lambda f: f.deadline)
        self._departures = _Due(lambda f: f.departs)

    # -- the jobs -------------------------------------------------------------
    def add(self, flight: InFlight) -> None:
        job = flight.job
        self._jobs[job.job_id] = flight
        self._steps += job.local_steps
        self._bases[job.base_version] = self._bases.get(job.base_version, 0) + 1
        self._cohorts.setdefault((flight.t_dispatch, job.base_version), set()).add(job.job_id)
        self._deadlines.add(flight)
        self._departures.add(flight)

    def pop(self, job_id: int) -> InFlight:
        flight = self._jobs.pop(job_id)
        job = flight.job
        self._steps -= job.local_steps
        if self._bases[job.base_version] == 1:
            del self._bases[job.base_version]
        else:
            self._bases[job.base_version] -= 1
        key = (flight.t_dispatch, job.base_version)
        cohort = self._cohorts[key]
        cohort.discard(job_id)
        if not cohort:
            del self._cohorts[key]
        self._deadlines.compact(self._jobs)
        self._departures.compact(self._jobs)
        return flight

    def __getitem__(self, job_id: int) -> InFlight:
        return self._jobs[job_id]

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[int]:
        """Job ids in dispatch order."""
        return iter(self._jobs)

    def ids(self) -> list[int]:
        """Job ids in order."""
        return sorted(self._jobs)

    def flights(self) -> list[InFlight]:
        """The jobs in flight, in job-id order."""
        return [self._jobs[j] for j in sorted(self._jobs)]

    # -- queries --------------------------------------------------------------
    def steps(self) -> int:
        """Inner steps of all the jobs in flight."""
        return self._steps

    def base_versions(self) -> set[int]:
        """The global versions the jobs in flight started from."""
        return set(self._bases)

    def cohort(self, t_dispatch: float, base_version: int) -> set[int]:
        """The jobs in flight handed out at ``t_dispatch`` from ``base_version``."""
        return set(self._cohorts.get((t_dispatch, base_version), ()))

    def first_overdue(self, now: float) -> int | None:
        """The lowest id of the jobs in flight whose deadline is ``now`` or before (``now``
        never goes back), or None."""
        return self._deadlines.first(now, self._jobs)

    def next_deadline(self) -> float | None:
        """The earliest deadline of the jobs in flight, or None."""
        return self._deadlines.soonest(self._jobs)

    def first_departed(self, now: float) -> int | None:
        """The lowest id of the jobs in flight whose worker has gone away by ``now``."""
        return self._departures.first(now, self._jobs)

    def next_departure(self) -> float | None:
        """The earliest time a worker of a job in flight goes away, or None."""
        return self._departures.soonest(self._jobs)

    # -- checkpoints ----------------------------------------------------------
    def state_dict(self) -> dict[int, InFlight]:
        """job id -> ``InFlight``, in dispatch order (the checkpoint format since the
        engine split: the loop's ``in_flight`` was this very dict)."""
        return dict(self._jobs)

    def load_state_dict(self, state: dict[int, InFlight]) -> None:
        self._reset()
        for flight in state.values():
            self.add(flight)


class _Due:
    """The jobs in flight by a time each may have (``when``: a deadline, a departure),
    indexed only once asked: times not yet passed, (time, job id), and the ids of jobs
    whose time has passed, both heaps. A job no longer in flight is dropped when met,
    and all of them when they outnumber the jobs in flight."""

    def __init__(self, when) -> None:
        self.when = when
        self._pending: list[tuple[float, int]] | None = None
        self._passed: list[int] = []

    def add(self, flight: InFlight) -> None:
        t = self.when(flight)
        if self._pending is not None and t is not None:
            heapq.heappush(self._pending, (t, flight.job.job_id))

    def compact(self, jobs: dict[int, InFlight]) -> None:
        if self._pending is not None and \
                len(self._pending) + len(self._passed) > 2 * len(jobs) + 64:
            self._index(jobs)

    def _index(self, jobs: dict[int, InFlight]) -> None:
        self._pending = [(t, j) for j, f in jobs.items() if (t := self.when(f)) is not None]
        heapq.heapify(self._pending)
        self._passed = []  # found again: ``now`` never goes back

    def first(self, now: float, jobs: dict[int, InFlight]) -> int | None:
        if self._pending is None:
            self._index(jobs)
        while self._pending and self._pending[0][0] <= now:
            _, job_id = heapq.heappop(self._pending)
            if job_id in jobs:
                heapq.heappush(self._passed, job_id)
        while self._passed and self._passed[0] not in jobs:
            heapq.heappop(self._passed)
        return self._passed[0] if self._passed else None

    def soonest(self, jobs: dict[int, InFlight]) -> float | None:
        if self._pending is None:
            self._index(jobs)
        passed = [self.when(jobs[j]) for j in self._passed if j in jobs]
        while self._pending and self._pending[0][1] not in jobs:
            heapq.heappop(self._pending)
        return min(passed + ([self._pending[0][0]] if self._pending else []), default=None)
