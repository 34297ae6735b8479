"""The numbers of experiments/results/frontier.md beyond its sweep report: every arm
against the best synchronous arm of its fleet, and the ranking of the arms at the long
and at the short horizon.

    PYTHONPATH=examples fedlm sweep experiments/configs/frontier.toml --backend inprocess --jobs 2
    PYTHONPATH=examples fedlm sweep experiments/configs/frontier.toml --quick --arms "b halos" \
        --db runs/frontier_short.db --out runs/frontier_short_sweep.md --backend inprocess
    python experiments/frontier_report.py runs/frontier.db --short runs/frontier_short.db \
        --sync "sync + fill" --sync "sync + fill, Muon inside" > runs/frontier_tables.md

The sweep report compares every arm with the spec's reference (sync + fill). The goal of
the study is stated against the best synchronous arm, which the runs decide: of the
arms named by ``--sync``, the one with the lowest mean final perplexity over the
held-out seeds, per fleet. Against it, per arm (mean and 95% t interval over the seeds,
differences paired by seed): the final perplexity at equal inner steps (tokens) and at
equal virtual time, the virtual time over the best arm's, the time to reach the best
arm's final perplexity (over the best arm's own time; how many seeds get there; its
resolution, as the report's "grid"), and where present worker time went. Nothing here
runs anything: it reads the stores.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from fedlm import store  # noqa: E402
from fedlm.store.yardstick import Yardstick, yardstick  # noqa: E402
from fedlm.sweep.curves import first_reaching, resolution  # noqa: E402
from fedlm.sweep.fairness import at_equal_time, at_equal_work  # noqa: E402
from fedlm.sweep.uncertainty import Estimate, estimate, relative_difference  # noqa: E402

HELD_OUT = (300, 301, 302)
NAME = re.compile(r"^(?P<arm>.*) @ (?P<profile>\S+)(?: \[[^\]]*\])? seed (?P<seed>\d+)$")


@dataclass(frozen=True)
class Run:
    """What this report reads of one finished run."""

    final: float  # last evaluated perplexity
    time: float  # virtual seconds
    curve: list  # (virtual time, tokens, perplexity) per evaluation
    stick: Yardstick  # time over the bound and where present worker time went


Fleets = dict[str, dict[str, dict[int, Run]]]  # fleet -> arm -> seed -> run


def held_out(db: str) -> Fleets:
    """The finished held-out runs of a store whose arms are labelled "FLEET: ARM"."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for row in store.list_runs(db):
        m = NAME.match(row["name"])
        if not m or row["status"] != "finished" or int(m["seed"]) not in HELD_OUT:
            continue
        fleet, _, arm = m["arm"].partition(": ")
        out[fleet][arm][int(m["seed"])] = Run(row["last_perplexity"], row["virtual_time"],
                                               store.tokens_curve(db, row["id"]),
                                               yardstick(db, row["id"]))
    return out


def shown(est: Estimate | None, fmt: str = "{:.3f}") -> str:
    if est is None:
        return "-"
    if est.half_width is None:
        return fmt.format(est.mean)
    return f"{fmt.format(est.mean)} ± {fmt.format(est.half_width)}"


def final(runs: dict[int, Run]) -> Estimate:
    return estimate(r.final for r in runs.values())


def best_sync(arms: dict[str, dict[int, Run]], sync: list[str]) -> str:
    candidates = [a for a in sync if a in arms]
    if not candidates:
        raise SystemExit(f"none of the synchronous arms {sync} has held-out runs")
    return min(candidates, key=lambda a: final(arms[a]).mean)


def gaps(runs: dict[int, Run], best: dict[int, Run]) -> tuple:
    """Over the seeds both have: % at equal steps, % at equal time, time over the best's."""
    steps, times, clock = [], [], []
    for seed in sorted(set(runs) & set(best)):
        a, b = runs[seed], best[seed]
        work = at_equal_work(a.curve, b.curve)
        when = at_equal_time(a.curve, a.time, b.curve, b.time)
        if work and work.arm and work.reference:
            steps.append(relative_difference(work.arm, work.reference))
        if when and when.arm and when.reference:
            times.append(relative_difference(when.arm, when.reference))
        clock.append(a.time / b.time)
    return tuple(estimate(x) if x else None for x in (steps, times, clock))


def time_to_best(runs: dict[int, Run], best: dict[int, Run]) -> str:
    """Time to the best arm's final (same seed) over the best arm's time: mean over the
    seeds that get there, how many do, and the coarsest resolution."""
    ratios, grid = [], 0.0
    for seed in sorted(set(runs) & set(best)):
        t = first_reaching(runs[seed].curve, best[seed].final)
        if t is not None:
            ratios.append(t / best[seed].time)
            grid = max(grid, resolution(runs[seed].curve, t) / best[seed].time)
    if not ratios:
        return f"not reached (0 of {len(runs)})"
    return f"{shown(estimate(ratios), '{:.2f}')} ({len(ratios)} of {len(runs)}, grid {grid:.2f})"


def where_time_went(runs: dict[int, Run]) -> str:
    """Time over the fleet's bound, then the shares of present worker time."""
    sticks = [r.stick for r in runs.values()]
    bound = [s.ratio for s in sticks if s.ratio is not None]
    parts = [estimate(getattr(s, k) for s in sticks).mean * 100
             for k in ("goodput", "unapplied", "communication", "idle")]
    head = shown(estimate(bound), "{:.2f}") + "x" if bound else "-"
    return head + " | " + " | ".join(f"{p:.1f}%" for p in parts)


def fleet_table(fleet: str, arms: dict[str, dict[int, Run]], sync: list[str]) -> list[str]:
    best = best_sync(arms, sync)
    lines = [f"### {fleet}: against {best} (the best synchronous arm here)", "",
             "| arm | seeds | final ppl | at equal steps | at equal time | time x best's "
             "| to best's final, x its time | x bound | computing | never applied "
             "| communication | idle |", "|" + "---|" * 12]
    for arm, runs in sorted(arms.items(), key=lambda kv: final(kv[1]).mean):
        steps, times, clock = gaps(runs, arms[best])
        lines.append(f"| {arm} | {len(runs)} | {shown(final(runs))} | "
                     f"{shown(steps, '{:+.1f}')}% | {shown(times, '{:+.1f}')}% | "
                     f"{shown(clock, '{:.2f}')} | {time_to_best(runs, arms[best])} | "
                     f"{where_time_went(runs)} |")
    return lines + [""]


def ranking(long_runs: Fleets, short_runs: Fleets) -> list[str]:
    """Each fleet's arms by mean final perplexity at both horizons (common arms only)."""
    lines = ["### Ranking by final perplexity: long horizon against short", ""]
    for fleet in sorted(set(long_runs) & set(short_runs)):
        common = sorted(set(long_runs[fleet]) & set(short_runs[fleet]))
        order = {name: sorted(common, key=lambda a: final(runs[fleet][a]).mean)
                 for name, runs in (("long", long_runs), ("short", short_runs))}
        lines += [f"{fleet}:", "", "| rank | long horizon | final | short horizon | final |",
                  "|---|---|---|---|---|"]
        for k, (a, b) in enumerate(zip(order["long"], order["short"]), 1):
            lines.append(f"| {k} | {a} | {final(long_runs[fleet][a]).mean:.3f} | {b} | "
                         f"{final(short_runs[fleet][b]).mean:.3f} |")
        same = "the same" if order["long"] == order["short"] else "not the same"
        lines += ["", f"The order is {same} at both horizons.", ""]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", help="the long-horizon store, e.g. runs/frontier.db")
    ap.add_argument("--short", help="the short-horizon store, for the ranking check")
    ap.add_argument("--sync", action="append", required=True,
                    help="a synchronous arm's label (without its fleet), repeatable")
    args = ap.parse_args()
    try:
        long_runs = held_out(args.db)
        short_runs = held_out(args.short) if args.short else None
    except (FileNotFoundError, store.StoreError) as exc:  # one line, not a traceback
        raise SystemExit(f"frontier_report: {exc}") from None
    for fleet, arms in sorted(long_runs.items()):
        print("\n".join(fleet_table(fleet, arms, args.sync)))
    if short_runs is not None:
        print("\n".join(ranking(long_runs, short_runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
