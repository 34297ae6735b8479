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

The left side is continuous, piecewise linear and increasing in T (each worker joins
once T passes its X_w), so T is found exactly: workers sorted by X_w, the segment where
the sum reaches S, solved for T. Worked by hand: two workers at 1 step/s with no
transfers train 100 steps in 50 s; give the second a 10 s round trip and it is 55 s
(T + (T − 10) = 100). A method's virtual time over this bound says how far from what its
fleet allows it stayed (1: nothing to gain). It is a lower bound for a fleet that
changes too (slow-downs and absences only take capacity away), just a looser one.

Goodput: the share of the workers' present time (compute, exposed communication and
idle: the idle fraction's denominator, ``store.schema.idle_fraction``) spent computing
jobs whose updates the model took in (lost, cancelled and dropped work is not good).
"""

from __future__ import annotations

import math


def least_time(step_times: list[float], round_trips: list[float], steps: float) -> float:
    """The least virtual time in which workers of ``step_times`` (s/step) and one
    unavoidable round trip each (``round_trips``, s) train ``steps`` inner steps."""
    if steps <= 0:
        return 0.0
    if len(step_times) != len(round_trips) or not step_times:
        raise ValueError("least_time: one step time and one round trip per worker")
    workers = sorted(zip(round_trips, (1.0 / t for t in step_times)))
    rate = reach = 0.0  # steps a second of the workers joined so far; Σ v_w·X_w over them
    for k, (x, v) in enumerate(workers):
        rate, reach = rate + v, reach + v * x
        t = (steps + reach) / rate  # where the sum reaches S with these workers alone
        nxt = workers[k + 1][0] if k + 1 < len(workers) else math.inf
        if t <= nxt:  # before the next worker could join: this segment
            return t
    raise AssertionError("unreachable: the last segment runs to infinity")


def goodput(useful_compute: float, present: float) -> float:
    """Share of present worker time spent on useful compute (0 when nobody was present)."""
    return useful_compute / present if present > 0 else 0.0
