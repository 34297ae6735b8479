"""What a comparison of two runs needs to be fair, read from the run store: the same
start, and both clocks.

- **One start.** Two arms of one seed are compared as methods only if their federated
  phases began from the same weights (``RunSummary.start_hash``: after ``init.from``
  and pretraining). ``differing_starts`` finds the seeds where they did not; the
  report names them and marks every comparison that rests on such a pair.
- **Two clocks.** Work and time rank methods differently (an arm that ends sooner may
  end higher), so a pair is compared at equal work (tokens trained: the fewer of the
  two runs') and at equal virtual time (the sooner of the two ends, or a deadline the
  spec names), each run's last evaluation at or before that point.
"""

from __future__ import annotations

from dataclasses import dataclass

Curve = list[tuple[float, float, float]]  # (virtual time, tokens trained so far, perplexity)


def differing_starts(cells) -> dict[tuple[str, int | None], dict[str, list[str]]]:
    """``{(profile, seed): {start hash: [arms]}}`` where arms of one profile and seed
    started from more than one set of weights (runs from before starts were stored,
    with no hash, are left out)."""
    seen: dict[tuple[str, int | None], dict[str, list[str]]] = {}
    for c in cells:
        start = c.summary.start_hash
        if start:
            seen.setdefault((c.profile, c.seed), {}).setdefault(start, []).append(c.arm)
    return {key: starts for key, starts in seen.items() if len(starts) > 1}


def same_start(a, b) -> bool:
    """Whether runs ``a`` and ``b`` (cells) began from the same weights (unknown: yes)."""
    x, y = a.summary.start_hash, b.summary.start_hash
    return not x or not y or x == y


def at_or_before(curve: Curve, axis: int, point: float) -> float | None:
    """The perplexity of the curve's last evaluation whose ``axis`` (0: time, 1:
    tokens) is at or before ``point``."""
    found = None
    for row in curve:
        if row[axis] <= point * (1 + 1e-12):
            found = row[2]
    return found


@dataclass(frozen=True)
class Pair:
    """Two runs' perplexities at one point of a clock."""

    point: float  # tokens or virtual seconds
    arm: float | None
    reference: float | None


def at_equal_work(arm: Curve, reference: Curve) -> Pair | None:
    """Both at the fewer tokens of the two runs (None: a run with no evaluation)."""
    if not arm or not reference:
        return None
    point = min(arm[-1][1], reference[-1][1])
    return Pair(point, at_or_before(arm, 1, point), at_or_before(reference, 1, point))


def at_equal_time(arm: Curve, arm_end: float, reference: Curve, reference_end: float,
                  deadline: float | None = None) -> Pair | None:
    """Both at ``deadline``, else at the sooner of the two runs' ends."""
    if not arm or not reference:
        return None
    point = deadline if deadline is not None else min(arm_end, reference_end)
    return Pair(point, at_or_before(arm, 0, point), at_or_before(reference, 0, point))
