"""A sweep report's frontier: one figure per profile, every arm a point at x = its virtual
time over the fleet's bound (``fedlm.store.yardstick``: the least time its workers need
for the run's steps) and y = its per-update gap, its final perplexity against its
reference's at equal inner steps (%, paired by seed), each with its 95% interval as
error bars. An arm left of another spends less of the fleet's time; one below it loses
less per step: the arms to the lower left of the reference beat the trade, those to
the lower right or upper left make it.

Nothing here trains or hard-codes a number: the points are the report's own estimates,
from the run store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedlm.sweep.cells import final_gap
from fedlm.sweep.plots import by_seed, saved
from fedlm.sweep.uncertainty import Estimate, estimate


NOTE = ("One figure per profile: every arm a point at its virtual time over the fleet's "
        "bound (x) and its final perplexity against its reference's at equal inner steps "
        "(y, %, paired by seed), with 95% intervals as bars: lower left of the reference "
        "beats the trade between time and quality per step.")


@dataclass(frozen=True)
class Point:
    arm: str
    bound: Estimate  # time over the fleet's bound (x)
    gap: Estimate  # % against the reference at equal inner steps (y); 0 for the reference


def points(report, profile: str) -> list[Point]:
    """Every arm of ``report`` (``fedlm.sweep.report._Report``) on ``profile`` that has
    its bound and a reference run of the same seeds."""
    out = []
    for arm in report.arms:
        group = report.groups.get((arm, profile))
        if not group:
            continue
        ratios = [report.yardsticks[c.run_id].ratio for _, c in sorted(group.items(),
                                                                     key=by_seed)]
        gap = final_gap(group, report.ref_group(arm, group))  # the report's per-update gap
        if None in ratios or gap is None:
            continue
        out.append(Point(arm, estimate(ratios), gap))
    return out


def _error(est: Estimate) -> float:
    return est.half_width if est.half_width is not None else 0.0


def plot(report, out_prefix: Path) -> list[Path]:
    """One PNG per profile that has points; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for profile in report.profiles:
        found = points(report, profile)
        if not found:
            continue
        fig, ax = plt.subplots(figsize=(9.0, 4.6))
        for k, p in enumerate(found):  # past ten arms the colours come again, as other marks
            ax.errorbar(p.bound.mean, p.gap.mean, xerr=_error(p.bound), yerr=_error(p.gap),
                        fmt="osD^v"[k // 10 % 5], ms=5, capsize=3, color=f"C{k % 10}",
                        label=p.arm)
        ax.axhline(0.0, color="0.5", lw=0.8, ls="--")  # the reference's quality per step
        ax.axvline(1.0, color="0.5", lw=0.8, ls=":")  # the fleet's bound
        ax.set_xlabel("virtual time over the fleet's bound (x)")
        ax.set_ylabel(f"final perplexity vs {report.whose} at equal inner steps (%)")
        ax.set_title(f"{profile}: time against quality per step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        written.append(saved(fig, out_prefix.parent / f"{out_prefix.name}_frontier_{profile}.png"))
    return written
