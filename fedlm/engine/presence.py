"""Who is there: the engine's side of a fleet that changes over time.

``fedlm.sim.dynamics`` says when each worker is slowed and when it is absent; this
part acts on it inside the loop, the only place that knows the pool, the clock and
the log together:

- a free worker found absent is not offered a job: it was idle until its absence
  began, and is away (``IntervalKind.ABSENT``) until it ends, when the clock brings
  it back (``BackOnline``); a worker that left for good never comes back;
- a job whose worker goes away before it ends is lost then (``departed``): the
  worker is away from that moment, and the loss does not count towards retiring it;
- a straggling job is noted in the log, and the slowed spans are written as
  intervals when the run ends (an overlay of the timeline, not counted in totals);
- the local-steps policy is told each departure and return once it has happened
  (``LocalSteps.presence``), at the time it happened: a policy may learn how long
  workers stay, never from the trace's future.

Nothing here draws anything: the answers are functions of the run's seed, so replay
and resume see the same fleet. On the wall clock (real arrivals) absences, joins and
leaves work the same way, timed in real seconds since the run started: the engine
stops giving the worker work and drops its job in flight when it goes away (the node
itself is not stopped, as with ``faults.offline``); slow-downs and stragglers are
the machines' own there.
"""

from __future__ import annotations

import math

from fedlm.engine.runlog import RunLog
from fedlm.engine.workers import WorkerPool
from fedlm.sim.dynamics import FleetDynamics
from fedlm.sim.fleet import JobTiming
from fedlm.store import IntervalKind


class Presence:
    def __init__(self, dynamics: FleetDynamics, pool: WorkerPool, events, log: RunLog,
                 policy) -> None:
        self.dynamics = dynamics
        self.pool = pool
        self.events = events
        self.log = log
        self.policy = policy  # the local-steps policy, told who comes and goes

    def gone_away(self, w: int, now: float, version: int) -> bool:
        """Whether free worker ``w`` is absent now; if so it is moved out of the pool
        until it comes back."""
        span = self.dynamics.absent(w, now)
        if span is None:
            return False
        free_since = self.pool.free_since[w]
        since = max(free_since, span[0])
        if since > free_since:
            self.log.intervals([(w, self.pool.free_kind(w), free_since, since, version, None)])
        self._away(w, since, span[1])
        return True

    def absent_since(self, w: int, now: float) -> float | None:
        """When the absence ``w`` is in at ``now`` began (None: it is there); asks only."""
        span = self.dynamics.absent(w, now)
        return None if span is None else span[0]

    def departure(self, w: int, index: int, now: float, timing: JobTiming | None
                  ) -> float | None:
        """When the worker of a job dispatched now goes away before the job ends, if it
        does (noting a straggling job on the way)."""
        if timing is None:  # the wall clock: the job's end is not known in advance
            span = self.dynamics.absence(w, now)
            return span[0] if span is not None and span[0] > now else None
        straggle = self.dynamics.straggle(w, index)
        if straggle is not None:
            self.log.straggler(w, now, straggle.multiplier)
        return self.dynamics.departs(w, now, now + timing.total)

    def departed(self, w: int, now: float) -> None:
        """``w``'s job was lost because ``w`` went away now."""
        span = self.dynamics.absent(w, now)
        self._away(w, now, span[1] if span is not None else now)

    def everyone_left(self, in_flight) -> bool:
        """Whether the run can go no further: nothing in flight, nobody free, and no
        absent worker coming back (the log says so)."""
        if in_flight or self.pool.free_since or self.events.next_time() is not None:
            return False
        self.log.fleet_empty(self.events.now, len(self.pool.offline))
        return True

    def _away(self, w: int, since: float, until: float) -> None:
        self.pool.away(w, since, until)
        self.policy.presence(w, at=since, here=False)
        if math.isfinite(until):
            self.events.went_offline(w, until)
        self.log.absent(w, since, until)

    def slowed_rows(self, workers: int, end: float, version: int) -> list:
        """Interval rows of every worker's slowed spans up to ``end``."""
        return [(w, IntervalKind.SLOWED, a, b, version, None) for w in range(workers)
                for a, b in self.dynamics.slow_spans(w, end) if b > a]
