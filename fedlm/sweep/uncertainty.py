"""Uncertainty over seeds: means, sample standard deviations, 95% intervals of the
mean, paired differences, and bands around curves. Pure functions, no store.

A sweep runs each arm over a few seeds (``fedlm.sweep.run``); its report
(``fedlm.sweep.report``) and the dashboard's seed groups summarise them here.
With n seeds the interval of the mean is ``mean ± t(0.975, n-1) · sd / √n``
(Student t: with 2 or 3 seeds the normal 1.96 would claim far too much). scipy
is not a dependency, so the t quantile comes from a table (df 1..30, scipy's
values to 4 decimals) and, above 30, from its Cornish-Fisher expansion around
the normal quantile (within 1e-4 of the exact value there).

Paired differences compare two arms seed by seed (same profile, same seed: the
same data order, jitter and starting weights), so the seed's own effect cancels
and the interval is of the difference itself, not of two noisy means.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# t_{0.975, df} for df = 1..30 (scipy.stats.t.ppf(0.975, df), rounded to 4 decimals)
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
_Z975 = 1.959963984540054  # the normal quantile, the limit of t as df grows


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"df: must be at least 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975  # Cornish-Fisher: z + g1/df + g2/df², exact enough beyond df = 30
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    return z + g1 / df + g2 / df ** 2


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` values, their sample standard deviation and the half-width
    of the mean's 95% interval (both None when n = 1: one value has no spread)."""

    n: int
    mean: float
    sd: float | None
    half_width: float | None

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width


def estimate(values: Iterable[float]) -> Estimate:
    """Mean, sample sd (n-1 in the denominator) and 95% t interval of ``values``
    (at least one; all finite)."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("values: need at least one")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"values: must be finite, got {xs}")
    n = len(xs)
    mean = math.fsum(xs) / n
    if n == 1:
        return Estimate(1, mean, None, None)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    return Estimate(n, mean, sd, t975(n - 1) * sd / math.sqrt(n))


def relative_difference(value: float, reference: float) -> float:
    """``value`` against ``reference`` in percent: +5.0 is 5% above it."""
    return 100.0 * (value / reference - 1.0)


def ratio(value: float, reference: float) -> float:
    return value / reference


def paired(values: Mapping[Hashable, float], references: Mapping[Hashable, float],
           diff: Callable[[float, float], float] = relative_difference) -> list[float]:
    """``diff(value, reference)`` for every seed both have, in seed order: the paired
    differences. A seed only one side has (its run failed) is left out."""
    common = sorted(set(values) & set(references), key=_seed_order)
    return [diff(values[s], references[s]) for s in common]


def paired_estimate(values: Mapping[Hashable, float], references: Mapping[Hashable, float],
                    diff: Callable[[float, float], float] = relative_difference
                    ) -> Estimate | None:
    """Mean and 95% interval of the paired differences (None: no seed in common)."""
    diffs = paired(values, references, diff)
    return estimate(diffs) if diffs else None


def _seed_order(seed) -> tuple:
    return (seed is not None, seed)  # None (the spec's one unnamed seed) sorts first


@dataclass(frozen=True)
class Band:
    """Curves of several seeds on one grid: their mean, lowest and highest value."""

    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def band(curves: Sequence[tuple[Sequence[float], Sequence[float]]], points: int = 200) -> Band:
    """``curves`` (x ascending, y) interpolated linearly onto one grid, from the latest
    first x to the latest last x, and their mean, min and max at each grid point.

    Past its own last point a curve holds its last value: a finished run keeps its
    final model, so at a later time (or update count) its perplexity is its final one.
    The grid starts where every curve has begun, so no curve is extended backwards.
    """
    if not curves:
        raise ValueError("curves: need at least one")
    pairs = [(np.asarray(x, float), np.asarray(y, float)) for x, y in curves]
    if any(len(x) == 0 or len(x) != len(y) for x, y in pairs):
        raise ValueError("curves: each needs as many x as y values, at least one")
    start = max(x[0] for x, _ in pairs)
    end = max(x[-1] for x, _ in pairs)
    grid = np.unique(np.concatenate([np.linspace(start, end, points),
                                     *[x[(x >= start) & (x <= end)] for x, _ in pairs]]))
    ys = np.vstack([np.interp(grid, x, y) for x, y in pairs])
    return Band(grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0))
