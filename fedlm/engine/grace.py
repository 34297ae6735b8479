"""Which finished jobs are applied together: the grace window.

After the engine takes a finished job it may go on taking finished jobs for a
while before it hands out new work, so that those workers restart from the
same, newest model. Delayed Nesterov needs this: it makes the momentum step
only at every N-th arrival, and a worker that restarts before that step of its
cycle trains from a point the global model has since left (docs/async_local_sgd.md).
DyLU sizes every worker's job to take the same time, so the jobs handed out
together finish together: the window is there to catch them.

The rules (config ``grace``):

- off (``0``): every finished job is applied alone; its worker restarts at once.
- fixed (seconds ``τ``): the jobs finishing within τ of the first are taken before
  anyone restarts: the paper's grace period and its toy notebook's ``max_wait_time``.
  On the virtual clock the next finish is known in advance, so (as in the notebook)
  the first worker waits only until the last job that falls in the window.
- adaptive (``auto``: for the strategies that ask for it, delayed Nesterov, when jobs
  handed out together are meant to finish together, with DyLU or equally fast
  workers, and not where DyLU cannot make them: a worker whose transfers alone
  outlast the job DyLU sizes the others to; ``adaptive``: always):
  the window follows the jobs, not a constant. At the first finish t0, of a job
  that took d seconds, it waits for the jobs *expected* with it:

    * its cohort: the jobs handed out at the same moment from the same model, which
      DyLU sized to finish together (those expected later than t0 + span·d are left
      out: a worker whose transfers alone outlast the cohort's job, or one that was
      slowed, would hold the others up for nothing);
    * any other job in flight expected to finish by t0 + span·d, so that a worker
      that fell out of step joins the next group instead of staying apart;

  and closes as soon as all of them are in (or lost), at the latest span·d past the
  last one's expected finish: a crashed or very slow worker holds the others up by
  at most ``span`` of a job. A job's expected finish comes from what its worker has
  shown: the median seconds per inner step of its last jobs (a worker not seen yet:
  with its cohort's first). ``auto`` opens it only where jobs handed out together
  are meant to finish together; elsewhere (fixed H on uneven workers) waiting for a
  cohort would only make the fast workers idle.

Nothing here reads a clock: ``now`` is passed in, virtual or wall, and the same
rule runs on both. What a window decided is in the operation log (which updates
the strategy took before which dispatch), so replay needs nothing from here.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Iterator

from fedlm.engine.in_flight import InFlightJobs
from fedlm.engine.types import InFlight


@dataclass(frozen=True)
class Window:
    """An open grace window: the engine takes finished jobs until it closes."""

    opened: float
    closes: float  # the latest time it stays open
    # The jobs it waits for (it closes as soon as none is still in flight); None:
    # whatever finishes by ``closes`` (a fixed window).
    expected: frozenset[int] | None = None
    # those of them it has not yet seen gone (jobs only leave the jobs in flight while a
    # window is open, so each is looked for until it is gone, not at every event)
    _waiting: list[int] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._waiting.extend(sorted(self.expected or ()))

    def complete(self, in_flight: Container[int]) -> bool:
        """Every job it waits for is in (or lost)."""
        while self._waiting and self._waiting[-1] not in in_flight:
            self._waiting.pop()
        return self.expected is not None and not self._waiting


class NoGrace:
    """Every finished job is applied alone."""

    def open(self, now: float, first: InFlight, flights: InFlightJobs) -> Window | None:
        return None

    def dispatched(self, flight: InFlight) -> None:
        pass

    def observe(self, flight: InFlight, now: float) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict, flights: InFlightJobs) -> None:
        pass

    def describe(self) -> str:
        return "off"


class FixedGrace(NoGrace):
    """Jobs finishing within ``seconds`` of the first are taken together."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def open(self, now: float, first: InFlight, flights: InFlightJobs) -> Window:
        return Window(now, now + self.seconds)

    def describe(self) -> str:
        return f"fixed {self.seconds:g} s"


class AdaptiveGrace(NoGrace):
    """Wait for the jobs expected with the first, up to ``span`` of its job time."""

    history = 5  # jobs per worker whose pace predicts its next one

    def __init__(self, span: float, num_workers: int) -> None:
        self.span = span
        # per worker: seconds per inner step of its last finished jobs
        self.pace: list[list[float]] = [[] for _ in range(num_workers)]
        # (expected end, job id) of the jobs dispatched to a worker of known pace, a heap:
        # a window takes those due before it closes without looking at the others. A
        # job's expected end is fixed at dispatch (its worker's pace changes only when a
        # job of that worker comes back, and a worker has one job at a time); jobs no
        # longer in flight are dropped when a window meets them.
        self._ends: list[tuple[float, int]] = []

    def dispatched(self, flight: InFlight) -> None:
        end = self.expected_end(flight)
        if end is not None:
            heapq.heappush(self._ends, (end, flight.job.job_id))

    def observe(self, flight: InFlight, now: float) -> None:
        """A job came back with its update: learn its worker's pace."""
        steps = flight.job.local_steps
        if steps > 0 and now > flight.t_dispatch:
            hist = self.pace[flight.job.worker]
            hist.append((now - flight.t_dispatch) / steps)
            del hist[:-self.history]

    def expected_end(self, flight: InFlight) -> float | None:
        hist = self.pace[flight.job.worker]
        if not hist:
            return None
        return flight.t_dispatch + flight.job.local_steps * statistics.median(hist)

    def open(self, now: float, first: InFlight, flights: InFlightJobs) -> Window | None:
        slack = self.span * (now - first.t_dispatch)
        if slack <= 0:
            return None
        # the jobs it waits for, and when they are due: the first one's cohort, and any
        # job expected by now + slack; a cohort job expected later than that is not
        # waited for (its worker's transfers or a slow-down have set it apart: DyLU
        # could not make it end with the others, and waiting would idle them)
        expected: dict[int, float | None] = {}
        for j in flights.cohort(first.t_dispatch, first.job.base_version):
            end = self.expected_end(flights[j])
            if end is None or end <= now + slack:
                expected[j] = end
        due_by: list[tuple[float, int]] = []
        while self._ends and self._ends[0][0] <= now + slack:
            end, job_id = heapq.heappop(self._ends)
            if job_id in flights:
                expected[job_id] = end
                due_by.append((end, job_id))
        for entry in due_by:  # still in flight: later windows may wait for them too
            heapq.heappush(self._ends, entry)
        if not expected:
            return None
        # each one gets `slack` past the time it is expected (pace unknown: now)
        due = max([now, *(end for end in expected.values() if end is not None)])
        return Window(now, due + slack, frozenset(expected))

    def state_dict(self) -> dict:
        return {"pace": [list(h) for h in self.pace]}

    def load_state_dict(self, state: dict, flights: InFlightJobs) -> None:
        self.pace = [list(h) for h in state["pace"]]
        self._ends = []
        for flight in flights.flights():
            self.dispatched(flight)

    def describe(self) -> str:
        return f"adaptive, span {self.span:g}"


def grace_rule(setting: str, span: float, *, wants_grace: bool, synchronous: bool,
               together: bool, num_workers: int) -> NoGrace:
    """The rule a run's ``grace`` setting names. ``auto`` is the adaptive window where
    the strategy asks for one (``wants_grace``: ``fedlm.strategies.traits``) and the jobs
    handed out together are meant to finish together (``together``: DyLU sizes them so,
    or the workers are equally fast); off elsewhere, where waiting would only make a fast
    worker idle. A synchronous strategy's barrier makes any window moot."""
    if synchronous or setting == "off":
        return NoGrace()
    if setting == "adaptive" or (setting == "auto" and wants_grace and together):
        return AdaptiveGrace(span, num_workers)
    if setting == "auto":
        return NoGrace()
    seconds = float(setting)
    return FixedGrace(seconds) if seconds > 0 else NoGrace()


def grace_for(cfg: Any, server: Any, policy: Any, fleet: list) -> NoGrace:
    """The rule of a run: ``grace_rule`` of its settings and its strategy's (``server``:
    the engine's ``ServerCalls``, which says them), where jobs handed out together
    are meant to finish together if the local-steps policy sizes them so (asked after
    its ``start``: DyLU cannot where a worker's transfers alone outlast the job it
    sizes the others to) or every worker is equally fast."""
    return grace_rule(cfg.grace, cfg.grace_span, wants_grace=server.wants_grace,
                      synchronous=server.synchronous,
                      together=policy.sizes_even() or len({p.step_time for p in fleet}) == 1,
                      num_workers=len(fleet))


def window_events(window: Window, events: Any, in_flight: InFlightJobs,
                  done: Callable[[], bool]) -> Iterator[Any]:
    """The events the engine takes inside ``window`` (the finished jobs that belong with
    the one it just took), before any worker gets new work, so that they restart
    together: until the run is done, the window complete, or nothing more comes by its
    close. ``events`` is the engine's event source."""
    # A fixed window on the virtual clock knows its last arrival in advance: the
    # first worker waits only until then (the paper's toy notebook does the same).
    oracle = window.expected is None and events.lookahead
    while not done() and not window.complete(in_flight):
        event = events.next_event(until=window.closes, advance=not oracle)
        if event is None:
            return
        yield event


def late_jobs(window: Window, in_flight: InFlightJobs) -> list[int] | None:
    """The jobs an adaptive window waited for and closed without (None: it was fixed,
    or every one came)."""
    if window.expected is None or window.complete(in_flight):
        return None
    return sorted(j for j in window.expected if j in in_flight)
