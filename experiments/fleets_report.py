"""The numbers of experiments/archive/results/fleets.md (an archived study), from its run stores.

    fedlm sweep experiments/archive/configs/fleets.toml --backend inprocess --jobs 2
    fedlm sweep experiments/archive/configs/fleets_horizon.toml --backend inprocess --jobs 2
    fedlm sweep experiments/archive/configs/fleets_ablation.toml --backend inprocess --jobs 2
    python experiments/fleets_report.py runs/fleets.db --horizon runs/fleets_horizon.db \
        --ablation runs/fleets_ablation.db > runs/fleets_tables.md

The reference of every table is the strongest synchronous arm, sync DiLoCo + fill
(``REFERENCE``). Per fleet and arm, over the seeds: final perplexity (mean, 95% t
interval), inner steps, virtual time, and the virtual time to reach the reference's
final perplexity of the same seed (its first evaluation at or below it), as a ratio to
the reference's own time. Then the map (fleet x arm: the mean ratio, and on how many
seeds the arm gets there at all), what DN + DyLU's runs did (lost work, staleness,
versions); from the horizon store, DN + DyLU's ratio at other budgets (the main study's
runs are its `small` 1,600-step point); from the ablation store, DN + DyLU with one knob
changed at a time.
Plots go under experiments/archive/results/fleets/, beside that report.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedlm import store  # noqa: E402
from fedlm.store import readers as store_readers  # noqa: E402
from fedlm.store.connection import StoreError  # noqa: E402
from plotting import new_figure, save  # noqa: E402 - experiments/plotting.py, beside this

T95 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571}  # two-sided t by sample size
OUT = Path(__file__).resolve().parent / "archive" / "results" / "fleets"
REFERENCE = "DiLoCo (sync) + fill"
ORDER = [REFERENCE, "DiLoCo (sync)", "DiLoCo (sync) + DyLU", "DN + DyLU", "halos"]


def load(db: str) -> dict:
    """{(fleet, arm): {seed: run}} of the finished runs named "FLEET: ARM @ PROFILE seed S"."""
    runs: dict = defaultdict(dict)
    for row in store.list_runs(db):
        if row["status"] != "finished" or ": " not in row["name"]:
            continue
        label = row["name"].rsplit(" @ ", 1)[0]
        fleet, arm = label.split(": ", 1)
        curve = [(t, p) for t, _, p in store.metric_curve(db, row["id"])]
        summary = store.summarize(db, row["id"])
        runs[(fleet, arm)][row["seed"]] = {
            "id": row["id"], "curve": curve, "time": row["virtual_time"],
            "final": curve[-1][1], "steps": summary.local_steps, "updates": row["updates"],
            "at_budget": at_budget(db, row, summary), "workers": summary.workers,
            "work": store_readers.work(db, row["id"])}
    return runs


def at_budget(db: str, row, summary) -> tuple[float, float]:
    """(time, perplexity) of the run's last evaluation within its inner-step budget: a
    synchronous round is handed out whole, so a run may end past the budget (sync + fill's
    long rounds by up to a tenth of it); this is where it stood at equal work."""
    budget = json.loads(row["config_json"])["local_step_budget"]
    tokens_per_step = summary.tokens / max(1, summary.local_steps)
    points = [(t, p) for t, n, p in store.tokens_curve(db, row["id"])
              if n <= budget * tokens_per_step + 1e-9]
    return points[-1] if points else (row["virtual_time"], math.nan)


def seconds(t: float) -> str:
    return f"{t:,.0f}" if t >= 100 else f"{t:.3g}"


def reach(curve, target: float) -> float | None:
    """When a curve first gets to ``target`` or below (None: never)."""
    return next((t for t, p in curve if p <= target * (1 + 1e-9)), None)


def mean_interval(values: list[float], digits: int = 2) -> str:
    if len(values) < 2:
        return f"{values[0]:.{digits}f}" if values else "-"
    m, sd = statistics.mean(values), statistics.stdev(values)
    half = T95.get(len(values), 2.0) * sd / len(values) ** 0.5
    return f"{m:.{digits}f} ± {half:.{digits}f}"


def ratios(runs: dict, fleet: str, arm: str, at_budget: bool = False
           ) -> tuple[list[float], list[str], int]:
    """Per seed, the arm's time to the reference's final perplexity over the reference's
    time (``at_budget``: to where the reference stood at its last evaluation within the
    inner-step budget, over the time it got there); the per-seed cells of the table; the
    seeds it never got there on."""
    ref = runs.get((fleet, REFERENCE), {})
    out, cells, never = [], [], 0
    for seed, r in sorted(runs[(fleet, arm)].items()):
        if seed not in ref:
            continue
        ref_time, target = (ref[seed]["at_budget"] if at_budget
                            else (ref[seed]["time"], ref[seed]["final"]))
        t = reach(r["curve"], target)
        if t is None:
            cells.append(f"{seed}: never")
            never += 1
            continue
        out.append(t / ref_time)
        cells.append(f"{seed}: {seconds(t)} ({out[-1]:.2f})")
    return out, cells, never


def mean_ratio(runs: dict, fleet: str, arm: str, at_budget: bool = False) -> str:
    """The mean ratio over the seeds that got there, "(got/all)"; "never" if none did."""
    got, _, never = ratios(runs, fleet, arm, at_budget)
    if not got:
        return "never"
    return f"{statistics.mean(got):.2f} ({len(got)}/{len(got) + never})"


def arms_of(runs: dict, fleet: str) -> list[str]:
    found = {a for f, a in runs if f == fleet}
    return [a for a in ORDER if a in found] + sorted(found - set(ORDER))


def fleets_of(runs: dict) -> list[str]:
    return sorted({f for f, _ in runs})


def table(runs: dict, fleet: str) -> list[str]:
    lines = [f"### {fleet}", "",
             "| arm | final perplexity (95% interval) | at 1,600 steps | inner steps | versions "
             f"| virtual time s | time to {REFERENCE}'s final ppl, per seed (x its time) "
             "| mean x | at equal steps: mean x |", "|---|---|---|---|---|---|---|---|---|"]
    for arm in arms_of(runs, fleet):
        seeds = runs[(fleet, arm)]
        steps = sorted({r["steps"] for r in seeds.values()})
        _, cells, _ = ratios(runs, fleet, arm)
        lines.append(
            f"| {arm} | {mean_interval([r['final'] for r in seeds.values()])} | "
            f"{mean_interval([r['at_budget'][1] for r in seeds.values()])} | "
            f"{'/'.join(f'{s:,}' for s in steps)} | "
            f"{round(statistics.mean(r['updates'] for r in seeds.values())):,} | "
            f"{seconds(statistics.mean(r['time'] for r in seeds.values()))} | "
            f"{'; '.join(cells)} | {mean_ratio(runs, fleet, arm)} | "
            f"{mean_ratio(runs, fleet, arm, at_budget=True)} |")
    finals = "; ".join(f"{arm} " + " / ".join(f"{r['final']:.3f}" for _, r in
                                              sorted(runs[(fleet, arm)].items()))
                       for arm in arms_of(runs, fleet))
    return lines + ["", f"Finals per seed: {finals}.", ""]


def map_table(runs: dict) -> list[str]:
    """Fleet x arm: which arm gets to the reference's final perplexity first."""
    arms = [a for a in ORDER[1:] if any(a == b for _, b in runs)]
    lines = [f"| fleet | {' | '.join(arms)} | first there |", "|---" * (len(arms) + 2) + "|"]
    for fleet in fleets_of(runs):
        cells, best = [], (None, float("inf"))
        for arm in arms:
            if (fleet, arm) not in runs:
                cells.append("")
                continue
            got, _, never = ratios(runs, fleet, arm)
            if got and not never and statistics.mean(got) < best[1]:
                best = (arm, statistics.mean(got))
            cells.append(f"{statistics.mean(got):.2f} ({len(got)}/{len(got) + never})" if got
                         else f"never (0/{never})")
        first = best[0] if best[0] and best[1] < 1 else REFERENCE
        lines.append(f"| {fleet} | {' | '.join(cells)} | {first} |")
    return lines + [""]


def dn_diagnostics(runs: dict, arm: str = "DN + DyLU") -> list[str]:
    """What DN + DyLU's runs did, from their logs: work lost with departed jobs,
    staleness of the applied updates, jobs per version, and where the workers' time went
    (beside the reference's)."""
    lines = [f"| fleet | inner steps lost (departed): {arm} / the reference | mean staleness | max "
             "| versions | updates applied | reference's versions "
             "| time computing / on transfers / idle: "
             f"{arm} | the reference |", "|---|---|---|---|---|---|---|---|---|"]
    for fleet in fleets_of(runs):
        if (fleet, arm) not in runs:
            continue
        seeds = runs[(fleet, arm)]
        work = [r["work"] for r in seeds.values()]
        reference = runs.get((fleet, REFERENCE), {})
        ref = [r["updates"] for r in reference.values()] or [0]
        lines.append(f"| {fleet} | {lost_share(seeds)} / {lost_share(reference)} | "
                     f"{statistics.mean(w.mean_staleness for w in work):.2f} | "
                     f"{max(w.max_staleness for w in work)} | "
                     f"{round(statistics.mean(r['updates'] for r in seeds.values())):,} | "
                     f"{round(statistics.mean(w.updates for w in work)):,} | "
                     f"{round(statistics.mean(ref)):,} | {shares(seeds)} | "
                     f"{shares(reference)} |")
    return lines + [""]


def lost_share(seeds: dict) -> str:
    """Inner steps computed in jobs lost because their worker left, over all computed
    (mean over the seeds)."""
    if not seeds:
        return "-"
    lost = [r["work"].steps_departed / max(1, r["work"].steps_done + r["work"].steps_departed)
            for r in seeds.values()]
    return f"{100 * statistics.mean(lost):.1f}%"


def shares(seeds: dict) -> str:
    """The workers' present time computing, on exposed transfers and idle, all workers
    and seeds together (absences are not present time)."""
    totals = [0.0, 0.0, 0.0]
    for r in seeds.values():
        for w in r["workers"]:
            totals = [totals[0] + w.compute, totals[1] + w.communication, totals[2] + w.idle]
    whole = sum(totals)
    return " / ".join(f"{100 * x / whole:.0f}%" for x in totals) if whole else "-"


def horizon(runs: dict) -> list[str]:
    """DN + DyLU's time to the reference's final perplexity, per budget, from the horizon's
    runs (``with_main_budget``: fleets labelled "FLEET, MODEL BUDGET")."""
    lines = ["| fleet, budget | DN + DyLU: x fill's time, per seed | mean | finals: fill / DN |",
             "|---|---|---|---|"]
    for fleet in fleets_of(runs):
        if (fleet, "DN + DyLU") not in runs or ", " not in fleet:
            continue
        _, cells, _ = ratios(runs, fleet, "DN + DyLU")
        finals = " / ".join(mean_interval([r["final"] for r in runs[(fleet, a)].values()])
                            for a in (REFERENCE, "DN + DyLU"))
        lines.append(f"| {fleet} | {'; '.join(cells)} | {mean_ratio(runs, fleet, 'DN + DyLU')} "
                     f"| {finals} |")
    return lines + [""]


def with_main_budget(runs: dict, main: dict) -> dict:
    """The horizon's runs plus the main study's on the fleets the horizon covers, labelled
    as its `small` 1,600-step point."""
    covered = {f.split(", ")[0] for f, _ in runs if ", " in f}
    out = dict(runs)
    for (fleet, arm), seeds in main.items():
        if fleet in covered and arm in (REFERENCE, "DN + DyLU"):
            out[(f"{fleet}, small 1,600", arm)] = seeds
    return out


def ablation(runs: dict) -> list[str]:
    """Per ablation arm (one knob of DN + DyLU changed): its final perplexity, its time to
    the reference's final one (x the reference's time), the work lost with departed jobs
    and the staleness of its updates, from the runs' logs."""
    lines = ["| fleet | arm | final perplexity | x fill's time, per seed | inner steps lost "
             "| mean staleness | max | updates |", "|---|---|---|---|---|---|---|---|"]
    for fleet in fleets_of(runs):
        for arm in arms_of(runs, fleet):
            seeds = runs[(fleet, arm)]
            work = [r["work"] for r in seeds.values()]
            _, cells, _ = ratios(runs, fleet, arm)
            lines.append(
                f"| {fleet} | {arm} | {mean_interval([r['final'] for r in seeds.values()])} | "
                f"{'; '.join(cells)} | {lost_share(seeds)} | "
                f"{statistics.mean(w.mean_staleness for w in work):.2f} | "
                f"{max(w.max_staleness for w in work)} | "
                f"{round(statistics.mean(r['updates'] for r in seeds.values())):,} |")
    return lines + [""]


def plot_curves(runs: dict, fleet: str, path: Path) -> None:
    fig, ax = new_figure((6.4, 3.6))
    for k, arm in enumerate(arms_of(runs, fleet)):
        for j, (_, r) in enumerate(sorted(runs[(fleet, arm)].items())):
            t, p = zip(*r["curve"])
            ax.plot(t, p, color=f"C{k}", alpha=0.8, lw=1, label=arm if j == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("validation perplexity")
    ax.set_title(f"{fleet} (small model, held-out seeds)", fontsize=10)
    save(fig, ax, path)


def plot_map(runs: dict, path: Path) -> None:
    """Per fleet, each arm's mean time to the reference's final perplexity (x its time);
    an arm that never gets there on some seed is drawn hatched at its mean where it did."""
    fleets = fleets_of(runs)
    arms = [a for a in ORDER[1:] if any(a == b for _, b in runs)]
    fig, ax = new_figure((7.2, 3.6))
    width = 0.8 / max(1, len(arms))
    labelled: set = set()
    for k, arm in enumerate(arms):
        for i, fleet in enumerate(fleets):
            if (fleet, arm) not in runs:
                continue
            got, _, never = ratios(runs, fleet, arm)
            height = statistics.mean(got) if got else 1.6
            ax.bar(i + k * width, height, width, color=f"C{k + 1}",
                   hatch="//" if never else None, label=arm if arm not in labelled else None)
            labelled.add(arm)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.9, color="k", lw=0.8, ls=":")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(fleets))], fleets, fontsize=8)
    ax.set_ylabel(f"time to {REFERENCE}'s\nfinal ppl (x its time)", fontsize=8)
    ax.set_title("Where asynchrony pays (hatched: never there on some seed; 1.6: never)",
                 fontsize=9)
    save(fig, ax, path)


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


def plot_horizon(runs: dict, path: Path) -> None:
    """DN + DyLU's mean time to the reference's final perplexity against the budget, a
    line per fleet and model (hollow: never there on some seed)."""
    lines: dict = defaultdict(list)
    for fleet in fleets_of(runs):
        if (fleet, "DN + DyLU") not in runs or ", " not in fleet:
            continue
        base, scale = fleet.split(", ")
        model, budget = scale.split(" ")
        got, _, never = ratios(runs, fleet, "DN + DyLU")
        if got:
            lines[(base, model)].append((int(budget.replace(",", "")),
                                         statistics.mean(got), bool(never)))
    fig, ax = new_figure((6.4, 3.6))
    for k, ((base, model), points) in enumerate(sorted(lines.items())):
        points.sort()
        ax.plot([b for b, _, _ in points], [m for _, m, _ in points], color=f"C{k}",
                marker="o", label=f"{base} ({model})")
        for b, m, partial in points:
            if partial:
                ax.plot(b, m, marker="o", color="white", markeredgecolor=f"C{k}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("inner steps in all (budget)")
    ax.set_ylabel(f"DN + DyLU's time to\n{REFERENCE}'s final (x)", fontsize=8)
    ax.set_title("The horizon (hollow: never there on some seed; never on any: not drawn)",
                 fontsize=9)
    save(fig, ax, path)


def main() -> None:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("db", nargs="?", default="runs/fleets.db", help="the main study's store")
    parser.add_argument("--horizon", help="the horizon study's store")
    parser.add_argument("--ablation", help="the ablation study's store")
    args = parser.parse_args()
    runs = load(args.db)
    OUT.mkdir(parents=True, exist_ok=True)
    for fleet in fleets_of(runs):
        print("\n".join(table(runs, fleet)))
        plot_curves(runs, fleet, OUT / f"small_{slug(fleet)}.png")
    print("## Map\n")
    print("\n".join(map_table(runs)))
    plot_map(runs, OUT / "small_map.png")
    print("## DN + DyLU's runs\n")
    print("\n".join(dn_diagnostics(runs)))
    if args.horizon:
        budgets = with_main_budget(load(args.horizon), runs)
        print("## Horizon\n")
        print("\n".join(horizon(budgets)))
        plot_horizon(budgets, OUT / "horizon.png")
    if args.ablation:
        print("## Ablation\n")
        print("\n".join(ablation(load(args.ablation))))


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, StoreError) as exc:  # a store that is missing or no store
        sys.exit(f"fleets_report: error: {exc}")
