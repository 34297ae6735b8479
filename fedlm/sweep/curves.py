"""A run's perplexity curve as a sweep reads it: its evaluations over virtual time,
when it first reached a target perplexity, and where it stood by a given time.

Apart from the report (``fedlm.sweep.report``), which compares arms with these, because
a curve is read the same way by anything that compares runs outside a report
(``experiments/compare.py``).
"""

from __future__ import annotations

from fedlm import store

Curve = list[tuple[float, int, float]]  # (virtual time, version, perplexity)


def run_curve(db: str, run_id: int) -> Curve:
    """The run's evaluations in the store, in order."""
    return store.metric_curve(db, run_id)


def first_reaching(curve: Curve, target: float) -> float | None:
    """The virtual time of the curve's first evaluation at or below ``target``."""
    return next((vt for vt, _, ppl in curve if ppl <= target), None)


# how a report says ``resolution``
GRID_NOTE = ("grid: how long before it its run's previous evaluation came (the coarsest over "
             "seeds), the resolution the time has: an arm evaluated once a round knows it to "
             "a round")


def resolution(curve: Curve, t: float) -> float:
    """How much earlier than ``t`` the curve's evaluation before it came (``t`` if none):
    a time read from evaluations as "first at or below a target" is known to that
    much (a synchronous arm evaluated once a round: a round)."""
    before = [vt for vt, _, _ in curve if vt < t]
    return t - before[-1] if before else t


def last_before(curve: Curve, t: float) -> float | None:
    """The curve's last evaluated perplexity at or before virtual time ``t``."""
    best = None
    for vt, _, ppl in curve:
        if vt <= t:
            best = ppl
    return best


def time_to_reach(db: str, run_id: int, target: float) -> float | None:
    """When the run's curve first reached ``target`` (virtual s), or None."""
    return first_reaching(run_curve(db, run_id), target)


def value_at(db: str, run_id: int, t: float) -> float | None:
    """The run's last evaluated perplexity at or before virtual time ``t``."""
    return last_before(run_curve(db, run_id), t)
