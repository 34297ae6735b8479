"""A sweep report's plots: perplexity against virtual time and against updates, one
panel per profile; an arm over several seeds as its mean curve with a min-max band."""

from __future__ import annotations

from pathlib import Path

from fedlm import store
from fedlm.sweep.run import Cell
from fedlm.sweep.uncertainty import band


def groups_of(cells: list[Cell]) -> dict[tuple[str, str], dict]:
    """The finished cells by (arm, profile), each a ``{seed: cell}``."""
    out: dict[tuple[str, str], dict] = {}
    for c in cells:
        out.setdefault((c.arm, c.profile), {})[c.seed] = c
    return out


def by_seed(item) -> tuple:
    """Sort key of ``(seed, cell)`` items: the seedless cell first, then by seed."""
    seed = item[0]
    return (seed is not None, seed)


BAND_NOTE = ("an arm run over several seeds is drawn as its mean curve over seeds "
             "(each seed interpolated onto a common grid; past its end a seed keeps its "
             "final perplexity) with a band from the lowest to the highest seed")


def plot(spec: dict, cells: list[Cell], out_prefix: Path) -> list[Path]:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = spec["profiles"]
    # The main arms only: ablation arms (their own profiles, or another reference) would
    # crowd the plot past what a legend can tell apart; they are in the tables.
    main = [a for a in spec["arm"] if "against" not in a and "profiles" not in a]
    arms = [a["label"] for a in (main or spec["arm"])]
    groups = groups_of(cells)
    # no untrained start: its perplexity would stretch the axis past the rest
    curves = {c.run_id: store.metric_curve(spec["db"], c.run_id)[1:] for c in cells}
    written = []
    for xname, xi, xlabel in [("time", 0, "virtual time (s)"), ("updates", 1, "updates applied")]:
        fig, axes = plt.subplots(1, len(profiles), figsize=(4.2 * len(profiles), 3.8),
                                 squeeze=False, sharey=True)
        for ax, profile in zip(axes[0], profiles):
            for k, arm in enumerate(arms):
                group = groups.get((arm, profile))
                if not group:  # failed: no curve
                    continue
                pts = [curves[c.run_id] for _, c in sorted(group.items(), key=by_seed)]
                pts = [p for p in pts if p]
                if len(pts) == 1:
                    ax.plot([p[xi] for p in pts[0]], [p[2] for p in pts[0]], marker=".", ms=3,
                            label=arm, color=f"C{k}", lw=1.4)
                elif pts:
                    b = band([([p[xi] for p in c], [p[2] for p in c]) for c in pts])
                    ax.fill_between(b.x, b.low, b.high, color=f"C{k}", alpha=0.2, lw=0)
                    ax.plot(b.x, b.mean, color=f"C{k}", lw=1.4,
                            label=f"{arm} (mean of {len(pts)} seeds, band min–max)")
            ax.set_title(profile)
            ax.set_xlabel(xlabel)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.grid(alpha=0.3, which="both")
        axes[0][0].set_ylabel("validation perplexity")
        axes[0][-1].legend(fontsize=7, loc="upper right")
        written.append(saved(fig, out_prefix.parent / f"{out_prefix.name}_ppl_vs_{xname}.png"))
    return written


def saved(fig, path: Path) -> Path:
    """``fig`` laid out and written to ``path`` as a report's PNG, then closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
