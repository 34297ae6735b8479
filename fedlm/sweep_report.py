"""The report of a sweep: tables and plots from the run store, no training.

``write_report`` writes the spec's markdown report and its PNG plots: final
validation perplexity per arm × profile laid out like the paper's table (with the
paper's numbers beside ours), the virtual time each run needed, the virtual time to
reach the reference's final perplexity, idle fractions, and perplexity against
virtual time and against updates.
"""

from __future__ import annotations

from pathlib import Path

from fedlm import store
from fedlm.sweep import Cell, Failure, SweepResult, cells_of, reference_of


def _curve(db: str, run_id: int) -> list[tuple[float, int, float]]:
    return store.metric_curve(db, run_id)


def time_to_reach(db: str, run_id: int, target: float) -> float | None:
    for vt, _, ppl in _curve(db, run_id):
        if ppl <= target:
            return vt
    return None


def value_at(db: str, run_id: int, t: float) -> float | None:
    """The run's last evaluated perplexity at or before virtual time ``t``."""
    best = None
    for vt, _, ppl in _curve(db, run_id):
        if vt <= t:
            best = ppl
    return best


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
    written = []
    for xname, xi, xlabel in [("time", 0, "virtual time (s)"), ("updates", 1, "updates applied")]:
        fig, axes = plt.subplots(1, len(profiles), figsize=(4.2 * len(profiles), 3.8),
                                 squeeze=False, sharey=True)
        for ax, profile in zip(axes[0], profiles):
            for k, arm in enumerate(arms):
                cell = next((c for c in cells if c.arm == arm and c.profile == profile), None)
                if cell is None:  # failed: no curve
                    continue
                pts = _curve(spec["db"], cell.run_id)[1:]  # skip the untrained start
                ax.plot([p[xi] for p in pts], [p[2] for p in pts], marker=".", ms=3,
                        label=arm, color=f"C{k}", lw=1.4)
            ax.set_title(profile)
            ax.set_xlabel(xlabel)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.grid(alpha=0.3, which="both")
        axes[0][0].set_ylabel("validation perplexity")
        axes[0][-1].legend(fontsize=7, loc="upper right")
        fig.tight_layout()
        path = out_prefix.parent / f"{out_prefix.name}_ppl_vs_{xname}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_report(spec: dict, result: SweepResult) -> tuple[str, list[Path]]:
    """Write the report of ``result``'s cells to the spec's ``out`` (markdown), its
    plots beside it (PNG). Returns the report's text and the files written."""
    out = Path(spec["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    pngs = plot(spec, result.cells, out.with_suffix(""))
    text = report(spec, result.cells, result.failures)
    text += "\n## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n"
    out.write_text(text)
    return text, [out, *pngs]


def report(spec: dict, cells: list[Cell], failures: list[Failure] = ()) -> str:
    db, profiles = spec["db"], spec["profiles"]
    arms = [a["label"] for a in spec["arm"]]
    arm_of = {a["label"]: a for a in spec["arm"]}
    ref = next(a["label"] for a in spec["arm"] if a.get("reference"))
    paper = spec.get("paper", {})
    paper_profiles = spec.get("paper_profiles", profiles)
    get = {(c.arm, c.profile): c for c in cells}
    ended = {(f.arm, f.profile): f.status for f in failures}  # failed | diverged
    planned = {(arm["label"], profile) for _, profile, arm in cells_of(spec)}
    own_refs = any(a.get("against") for a in spec["arm"])

    def table(title: str, fmt, with_paper: bool = False) -> list[str]:
        head = "| arm | " + " | ".join(profiles) + " |"
        if with_paper:
            head += " paper: " + " / ".join(paper_profiles) + " |"
        lines = [f"### {title}", "", head,
                 "|---|" + "---|" * (len(profiles) + (1 if with_paper else 0))]
        for arm in arms:
            row = f"| {arm} | " + " | ".join(
                fmt(get[(arm, p)]) if (arm, p) in get
                else ended.get((arm, p), "failed") if (arm, p) in planned else "–"
                for p in profiles) + " |"
            if with_paper:
                nums = paper.get(arm)
                row += (" " + " / ".join(f"{x:.2f}" for x in nums) if nums else " –") + " |"
            lines.append(row)
        return lines + [""]

    def ref_cell(c: Cell) -> Cell | None:
        return get.get((reference_of(spec, arm_of[c.arm]), c.profile))

    def reach(c: Cell, as_ratio: bool = False) -> str:
        """When ``c`` first reached its reference's final perplexity (virtual s,
        or as a fraction of the time the reference itself needed)."""
        r = ref_cell(c)
        if r is None:
            return "-"
        t = time_to_reach(db, c.run_id, r.summary.final_perplexity)
        if t is None:
            return "not reached"
        return f"{t / r.summary.virtual_time:.2f}" if as_ratio else f"{t:,.0f}"

    def gap(c: Cell) -> str:
        r = ref_cell(c)
        if r is None:
            return "-"
        return f"{100 * (c.summary.final_perplexity / r.summary.final_perplexity - 1):+.1f}%"

    whose = "its reference's" if own_refs else f"{ref}'s"
    out = [f"# {spec.get('title', 'Sweep')}", "", spec.get("description", "").strip(), "",
           f"Run store: `{db}` (run ids in the last table). Reference (sync): **{ref}**"
           + (" (an arm with `against` is compared with the arm it names)." if own_refs
              else "."), ""]
    out += table("Final validation perplexity", lambda c: f"{c.summary.final_perplexity:.3f}",
                 with_paper=bool(paper))
    out += table(f"Per-update gap: final perplexity against {whose}, at equal inner steps", gap)
    out += table("Virtual time the run needed (s)", lambda c: f"{c.summary.virtual_time:,.0f}")

    def ref_at(c: Cell) -> str:
        r = ref_cell(c)
        if r is None:
            return "-"
        v = value_at(db, r.run_id, c.summary.virtual_time)
        return "-" if v is None else f"{v:.3f}"

    out += table(f"{whose[0].upper() + whose[1:]} perplexity at the same virtual time "
                 f"(wall-clock view)", ref_at)
    out += table(f"Virtual time to reach {whose} final perplexity (s)", reach)
    out += table("... as a fraction of the reference's own time (below 1: sooner)",
                 lambda c: reach(c, as_ratio=True))
    out += table("Idle fraction (all workers)", lambda c: f"{100 * c.summary.idle_fraction:.1f}%")
    out += table("Updates applied / local steps",
                 lambda c: f"{c.summary.updates} / {c.summary.local_steps:,}")
    out += table("Run id and real time (s)",
                 lambda c: f"#{c.run_id}, {c.summary.wall_time:,.0f}")
    out += ["### Arms", ""] + [
        f"- **{a['label']}**: `{' '.join(a['set'])}`"
        + (f" (against {a['against']})" if a.get("against") else "")
        + (f" (only {', '.join(a['profiles'])})" if "profiles" in a else "")
        for a in spec["arm"]]
    out += ["", f"Shared: `{' '.join(spec.get('base', []))}`", ""]
    if failures:
        out += ["### Failed runs", ""] + [f"- **{f.arm} @ {f.profile}**: {f.reason}"
                                          for f in failures] + [""]
    if spec.get("discussion"):
        out += ["## Reading", "", spec["discussion"].strip(), ""]
    return "\n".join(out)
