"""The numbers of experiments/results/fleets.md, from the fleets sweep's run store.

    fedlm sweep experiments/configs/fleets.toml --backend inprocess --jobs 2
    python experiments/fleets_report.py runs/fleets.db > runs/fleets_tables.md

Per fleet and arm, over the seeds: final perplexity (mean, 95% t interval), virtual
time, and the virtual time to reach sync DiLoCo's final perplexity of the same seed
(the first evaluation at or below it), as a ratio to sync's own time and to sync +
DyLU's time to the same perplexity; plots of perplexity against virtual time under
experiments/results/fleets/.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedlm import store  # noqa: E402

T95 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776}  # two-sided t quantiles by sample size
OUT = Path(__file__).resolve().parent / "results" / "fleets"
SYNC, SYNC_DYLU, DN = "DiLoCo (sync)", "DiLoCo (sync) + DyLU", "DN + DyLU"


def load(db: str) -> dict:
    """{(fleet, arm): {seed: {"curve": [(t, ppl)], "time": T, "final": ppl, "steps": n}}}."""
    runs: dict = defaultdict(dict)
    for row in store.list_runs(db):
        if row["status"] != "finished":
            continue
        label, profile = row["name"].rsplit(" @ ", 1)
        fleet, arm = label.split(": ", 1)
        fleet = fleet if not fleet.startswith("a/b") else f"{fleet[:3]} {profile.split()[0]}"
        curve = [(t, p) for t, _, p in store.metric_curve(db, row["id"])]
        runs[(fleet, arm)][row["seed"]] = {
            "curve": curve, "time": row["virtual_time"], "final": curve[-1][1],
            "steps": store.summarize(db, row["id"]).local_steps}
    return runs


def seconds(t: float) -> str:
    return f"{t:,.0f}" if t >= 100 else f"{t:.3g}"


def reach(curve, target: float) -> float | None:
    return next((t for t, p in curve if p <= target * (1 + 1e-9)), None)


def interval(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}" if values else "-"
    m, sd = statistics.mean(values), statistics.stdev(values)
    half = T95.get(len(values), 2.0) * sd / len(values) ** 0.5
    return f"{m:.2f} ± {half:.2f}"


def table(runs: dict, fleet: str) -> list[str]:
    arms = sorted({a for f, a in runs if f == fleet}, key=lambda a: (a != SYNC, a))
    sync = runs.get((fleet, SYNC), {})
    sync_dylu = runs.get((fleet, SYNC_DYLU), {})
    lines = [f"### {fleet}", "",
             "| arm | final perplexity (95% interval) | inner steps | virtual time s "
             "| time to sync's final ppl, per seed (x sync's time) | mean x sync | "
             "mean x sync + DyLU's |", "|---|---|---|---|---|---|---|"]
    for arm in arms:
        seeds = runs[(fleet, arm)]
        finals = [r["final"] for r in seeds.values()]
        times = [r["time"] for r in seeds.values()]
        per_seed, vs_sync, vs_dylu, dylu_never = [], [], [], 0
        for seed in sorted(seeds):
            if seed not in sync:
                continue
            target = sync[seed]["final"]
            t = reach(seeds[seed]["curve"], target)
            if t is None:
                per_seed.append(f"{seed}: never")
                continue
            per_seed.append(f"{seed}: {seconds(t)} ({t / sync[seed]['time']:.2f})")
            vs_sync.append(t / sync[seed]["time"])
            if seed in sync_dylu:  # where sync + DyLU never gets there, no ratio: said apart
                td = reach(sync_dylu[seed]["curve"], target)
                if td:
                    vs_dylu.append(t / td)
                else:
                    dylu_never += 1
        steps = sorted({r["steps"] for r in seeds.values()})
        lines.append(
            f"| {arm} | {interval(finals)} | {'/'.join(f'{s:,}' for s in steps)} | "
            f"{seconds(statistics.mean(times))} | {'; '.join(per_seed)} | "
            f"{statistics.mean(vs_sync):.2f} ({len(vs_sync)}/{len(seeds)})" if vs_sync else
            f"| {arm} | {interval(finals)} | {'/'.join(f'{s:,}' for s in steps)} | "
            f"{seconds(statistics.mean(times))} | {'; '.join(per_seed)} | never")
        never = f"; sync + DyLU never on {dylu_never}" if dylu_never else ""
        lines[-1] += (f" | {statistics.mean(vs_dylu):.2f} ({len(vs_dylu)}{never}) |" if vs_dylu
                      else f" | - ({never.lstrip('; ') or 'none'}) |")
    return lines + [""]


def plot(runs: dict, fleet: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    arms = sorted({a for f, a in runs if f == fleet})
    for k, arm in enumerate(arms):
        for j, (seed, r) in enumerate(sorted(runs[(fleet, arm)].items())):
            t, p = zip(*r["curve"])
            ax.plot(t, p, color=f"C{k}", alpha=0.8, lw=1,
                    label=arm if j == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("validation perplexity")
    ax.set_title(fleet, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    runs = load(sys.argv[1] if len(sys.argv) > 1 else "runs/fleets.db")
    OUT.mkdir(parents=True, exist_ok=True)
    for fleet in sorted({f for f, _ in runs}):
        print("\n".join(table(runs, fleet)))
        name = "".join(c if c.isalnum() else "_" for c in fleet).strip("_")
        plot(runs, fleet, OUT / f"ppl_vs_time_{name}.png")


if __name__ == "__main__":
    main()
