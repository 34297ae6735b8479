"""The yardstick of a fleet: the least virtual time in which it can train a budget of
inner steps, whatever the method, and how much of its workers' time a run spent
computing (goodput).

The bound. Worker w trains ``v_w = 1 / step_time_w`` inner steps a second while it
computes. Whatever a method does, a worker's steps reach the model only once it has
received a model (a download) and sent back what it trained (an upload): so by time T
worker w can contribute at most ``max(0, v_w · (T − X_w))`` steps, where ``X_w`` is one
download and one upload over its link (latency + bytes / bandwidth each way). No
schedule does better than every worker computing all the time but for that one round
trip, so the least time to train ``S`` steps is the smallest T with

    Σ_w max(0, v_w · (T − X_w)) ≥ S.

The left side is continuous, piecewise linear and increasing in T (each worker adds v_w
to its slope once T passes its X_w), so T is found exactly by a sweep over those
moments: the segment where the sum reaches S, solved for T. Worked by hand: two workers
at 1 step/s with no transfers train 100 steps in 50 s; give the second a 10 s round trip
and it is 55 s (T + (T − 10) = 100). A method's virtual time over this bound says how
far from what its fleet allows it stayed (1: nothing to gain).

A fleet that changes over time. A worker computes and transfers only while it is there
(not absent, not offline), so by time T it can contribute at most
``max(0, v_w · (P_w(T) − X_w))`` steps, where ``P_w(T)`` is its present time in [0, T]:
the round trip is still paid once (a worker may keep its model across an absence), and
the compute happens only while present. Slow-downs only take capacity away, so they are
left out (a lower bound still, a looser one). The sum is still continuous, piecewise
linear and increasing: each worker adds v_w to its slope from the moment its present
time passes X_w, except while it is away; the same sweep finds T exactly.
Worked by hand: two workers at 1 step/s, no transfers, the second away over [10, 30):
100 steps take 60 s (T + (T − 20) = 100), not 50.

Goodput: the share of the workers' present time (compute, exposed communication and
idle: the idle fraction's denominator, ``store.schema.idle_fraction``) spent computing
jobs whose updates the model took in (lost, cancelled and dropped work is not good).
"""

from __future__ import annotations

import math


def least_time(step_times: list[float], round_trips: list[float], steps: float,
               away: list[list[tuple[float, float]]] | None = None) -> float:
    """The least virtual time in which workers of ``step_times`` (s/step) and one
    unavoidable round trip each (``round_trips``, s) train ``steps`` inner steps;
    ``away``: per worker, the spans (start, end) of virtual time it was not there."""
    if steps <= 0:
        return 0.0
    if len(step_times) != len(round_trips) or not step_times:
        raise ValueError("least_time: one step time and one round trip per worker")
    away = away if away is not None else [[] for _ in step_times]
    if len(away) != len(step_times):
        raise ValueError("least_time: one list of spans away per worker")
    changes: list[tuple[float, float]] = []  # (time, change of the steps a second)
    for step_time, trip, spans in zip(step_times, round_trips, away):
        changes += _rate_changes(1.0 / step_time, trip, _merged(spans))
    changes.sort()
    t = rate = done = 0.0
    for when, change in changes:
        if rate > 0 and done + rate * (when - t) >= steps:
            break  # the sum reaches the steps before this change: on this segment
        done, t, rate = done + rate * (when - t), when, rate + change
    return t + (steps - done) / rate  # after the last change every worker counts


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``spans`` from time 0 on, sorted, overlapping ones joined, empty ones dropped."""
    out: list[list[float]] = []
    clipped = ((max(0.0, a), b) for a, b in spans)
    for start, end in sorted((a, b) for a, b in clipped if b > a):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _rate_changes(v: float, trip: float, spans: list[tuple[float, float]]
                  ) -> list[tuple[float, float]]:
    """When a worker at ``v`` steps a second with round trip ``trip``, away over the
    merged ``spans``, starts (+v) and stops (−v) adding steps: from the moment its
    present time reaches ``trip``, while it is there."""
    changes = []
    present = 0.0
    t = 0.0
    counting = False
    for start, end in [*spans, (math.inf, math.inf)]:
        if not counting and present + (start - t) >= trip:  # it passes its round trip here
            changes.append((t + (trip - present), v))
            counting = True
        present += start - t
        if counting and start < math.inf:
            changes += [(start, -v), (end, v)]
        t = end
    return changes


def goodput(useful_compute: float, present: float) -> float:
    """Share of present worker time spent on useful compute (0 when nobody was present)."""
    return useful_compute / present if present > 0 else 0.0
