"""Fleets that change over time: slow-downs, stragglers, absences, joins and leaves.

A fleet profile (``fedlm.sim.fleet``) gives each worker one speed and one link for the
whole run; the per-job jitter and the daily bandwidth cycle only wobble around them.
Real fleets drift: a machine is shared and runs at a quarter of its speed for an hour,
a job now and then takes ten times longer (a preempted GPU, a swapping host), a phone
is only there while it charges, a data centre joins late or leaves for good. A
synchronous round waits for whoever is slowest *now*; a plan made from yesterday's
speeds (DyLU's) is wrong for a while. This module says, for each worker and each
virtual time, how fast it computes and whether it is there:

    slowdown      two states per worker, normal and slowed by ``factor``, with
                  exponential sojourns of mean ``normal`` and ``slow`` seconds
                  (``fleet.slowdown``); a job's compute stretches over the slow spans
                  it meets (its work is done at 1/factor of the speed there)
    stragglers    heavy tails: with probability ``p`` a job's compute is multiplied
                  by a Pareto(``alpha``) draw of at least ``factor``, at most ``max``
                  (``fleet.stragglers``), drawn from (seed, worker, job index)
    availability  absences: a seeded alternating process (``fleet.availability``:
                  mean ``up`` and ``down`` seconds), a FedScale availability trace
                  (``fleet.availability_trace``, ``fedlm.sim.traces``), a join time
                  (``fleet.join``: absent before it) and a leave time
                  (``fleet.leave``: absent from then on; 0 never), merged into one list of
                  absence intervals per worker

Every draw comes from a generator seeded by (run seed, worker), walked in time order
and cached, so the answer for a worker at a time does not depend on which questions
were asked before or in which order: a run, its replay and its resume see the same
fleet, and nothing here needs a checkpoint. The engine asks at dispatch (is the
worker there; when would its job's compute end; does it leave before the job ends)
and a worker that leaves mid-job loses that job (``departed``, as a crash does, but
not counted towards retiring it); it comes back, if ever, with new work.

On the wall clock (real arrivals) absences, joins and leaves are timed in real seconds
since the run started (``fedlm.engine.presence``); slow-downs and stragglers are the
virtual clock's only, real machines bring their own (``fedlm.config_check`` says so).
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np

from fedlm.sim.dynamics_settings import (AVAILABILITY_KEYS, SLOWDOWN_KEYS, STRAGGLER_KEYS,
                                         enabled, read_settings)
# re-exported: fedlm.runner and fedlm.cli name a run's fleet with dynamics.features
from fedlm.sim.dynamics_settings import features  # noqa: F401

Interval = tuple[float, float]  # [start, end) in virtual seconds; end may be inf


def _applies(s: dict[str, Any], worker: int, region: str) -> bool:
    who, where = s.get("workers", []), s.get("regions", [])
    if not who and not where:
        return True
    return worker in who or region in where


def _alternating(rng: np.random.Generator, mean_on: float, mean_off: float
                 ) -> Iterator[Interval]:
    """The 'off' intervals of a two-state process (exponential sojourns of mean
    ``mean_on`` and ``mean_off``), started in its stationary distribution."""
    t = 0.0
    off = rng.random() < mean_off / (mean_on + mean_off)
    while True:
        if off:
            end = t + float(rng.exponential(mean_off))
            yield (t, end)
            t = end
        t += float(rng.exponential(mean_on))
        off = True


def _merged(sources: list[Iterable[Interval]]) -> Iterator[Interval]:
    """The union of interval streams that are each in time order, as disjoint
    intervals in time order (touching ones joined)."""
    current: list[float] | None = None
    for a, b in heapq.merge(*sources):
        if b <= a:
            continue
        if current is not None and a <= current[1]:
            current[1] = max(current[1], b)
        else:
            if current is not None:
                yield (current[0], current[1])
            current = [a, b]
        if math.isinf(current[1]):  # gone for good: nothing after it counts
            break
    if current is not None:
        yield (current[0], current[1])


class _Timeline:
    """A worker's intervals of one kind, generated on demand and cached."""

    def __init__(self, intervals: Iterator[Interval]) -> None:
        self._source = intervals
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._done = False

    def _extend_past(self, t: float) -> None:
        while not self._done and (not self._ends or self._ends[-1] <= t):
            nxt = next(self._source, None)
            if nxt is None:
                self._done = True
                return
            self._starts.append(nxt[0])
            self._ends.append(nxt[1])

    def first_ending_after(self, t: float) -> Interval | None:
        """The interval that holds ``t``, or else the next one; None if none is left."""
        self._extend_past(t)
        k = bisect.bisect_right(self._ends, t)
        return (self._starts[k], self._ends[k]) if k < len(self._ends) else None

    def until(self, end: float) -> list[Interval]:
        """Every interval that starts before ``end``."""
        self._extend_past(end)
        k = bisect.bisect_left(self._starts, end)
        return list(zip(self._starts[:k], self._ends[:k]))


@dataclass(frozen=True)
class Straggle:
    multiplier: float  # the job's compute is this many times its nominal time


class FleetDynamics:
    """What changes over time in one run's fleet (built from its config and seed)."""

    def __init__(self, fleet_cfg: Any, regions: list[str], seed: int,
                 availability_windows: list[Any] | None = None) -> None:
        f = fleet_cfg
        n = len(regions)
        self.seed = seed
        self.slowdown = read_settings("fleet.slowdown", f.slowdown, SLOWDOWN_KEYS) \
            if f.slowdown else None
        self.stragglers = read_settings("fleet.stragglers", f.stragglers, STRAGGLER_KEYS) \
            if f.stragglers else None
        process = read_settings("fleet.availability", f.availability, AVAILABILITY_KEYS) \
            if f.availability else None
        self._straggler_workers = {w for w, r in enumerate(regions)
                                   if self.stragglers is not None
                                   and _applies(self.stragglers, w, r)}
        self._slow: list[_Timeline | None] = []
        self._away: list[_Timeline | None] = []
        for w in range(n):
            s = self.slowdown
            self._slow.append(
                _Timeline(_alternating(np.random.default_rng([seed, 104729, w]),
                                       s["normal"], s["slow"]))
                if s is not None and _applies(s, w, regions[w]) else None)
            sources: list[Iterable[Interval]] = []
            if process is not None and _applies(process, w, regions[w]):
                sources.append(_alternating(np.random.default_rng([seed, 130363, w]),
                                            process["up"], process["down"]))
            if availability_windows:
                entry = availability_windows[w % len(availability_windows)]
                sources.append(entry.absences(f.trace_time_scale))
            if w < len(f.join) and f.join[w] > 0:
                sources.append(iter([(0.0, float(f.join[w]))]))
            if w < len(f.leave) and f.leave[w] > 0:
                sources.append(iter([(float(f.leave[w]), math.inf)]))
            self._away.append(_Timeline(_merged(sources)) if sources else None)

    # -- speed ------------------------------------------------------------------
    def straggle(self, worker: int, job_index: int) -> Straggle | None:
        """The heavy-tailed multiplier of ``worker``'s ``job_index``-th job, if it straggles."""
        s = self.stragglers
        if s is None or worker not in self._straggler_workers:
            return None
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 611953, worker,
                                                            job_index]))
        if rng.random() >= s["p"]:
            return None
        pareto = (1.0 - rng.random()) ** (-1.0 / s["alpha"])  # >= 1, tail exponent alpha
        return Straggle(min(s["factor"] * pareto, s["max"]))

    def compute_end(self, worker: int, start: float, work: float) -> float:
        """When ``work`` seconds of nominal compute started at ``start`` end, done at
        1/factor of the speed while the worker is slowed."""
        timeline = self._slow[worker] if self._slow else None
        if timeline is None or work <= 0:
            return start + work
        factor = self.slowdown["factor"]
        t = start
        left = work
        while True:
            span = timeline.first_ending_after(t)
            if span is None:  # pragma: no cover - the process never ends
                return t + left
            a, b = span
            if a > t:  # normal speed until the next slow span
                if left <= a - t:
                    return t + left
                left -= a - t
                t = a
            room = (b - t) / factor  # nominal seconds done by the end of the slow span
            if left <= room:
                return t + left * factor
            left -= room
            t = b

    def slow_spans(self, worker: int, end: float) -> list[Interval]:
        """``worker``'s slowed spans that start before ``end``, cut at ``end``."""
        timeline = self._slow[worker] if self._slow else None
        if timeline is None:
            return []
        return [(a, min(b, end)) for a, b in timeline.until(end)]

    # -- presence -----------------------------------------------------------------
    def absence(self, worker: int, t: float) -> Interval | None:
        """The absence that holds ``t``, or else ``worker``'s next one (None: always there)."""
        timeline = self._away[worker] if self._away else None
        return None if timeline is None else timeline.first_ending_after(t)

    def absent(self, worker: int, t: float) -> Interval | None:
        """The absence ``worker`` is in at ``t``, or None if it is there."""
        span = self.absence(worker, t)
        return span if span is not None and span[0] <= t else None

    def departs(self, worker: int, start: float, end: float) -> float | None:
        """When ``worker`` goes away during [start, end), if it does."""
        span = self.absence(worker, start)
        return span[0] if span is not None and start < span[0] < end else None


def build(cfg: Any, regions: list[str], seed: int) -> FleetDynamics | None:
    """The run's fleet dynamics, or None when nothing changes over time."""
    if not enabled(cfg):
        return None
    windows = None
    if cfg.availability_trace:
        from fedlm.sim import traces  # only runs that name a trace read one
        windows = traces.load_availability_trace(cfg.availability_trace)
    return FleetDynamics(cfg, regions, seed, windows)
