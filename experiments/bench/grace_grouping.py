"""Which grace rule keeps delayed Nesterov's cohorts together: timing only, no training.

    python experiments/bench/grace_grouping.py [--seeds 8]
    python experiments/bench/grace_grouping.py --smoke   # 2 fleets, 1 seed, nothing written

The real engine runs delayed Nesterov with DyLU (H = 20, 300 inner steps per worker)
on a transport that answers every job at once with a zero update, so only the
virtual clock matters: the grace rule's decisions depend on job times alone, which
come from the fleet's profiles and seeded jitter, not from what the jobs compute.
For each fleet and rule it reports, over seeds, the share of dispatch passes that
hand work to every worker at once (a full cohort: all restart from the same model,
which is what makes delayed Nesterov's momentum step land as sync DiLoCo's does),
the lowest share of any seed, the mean staleness, the idle fraction and the virtual
time. These runs chose ``grace_span`` and DyLU's rounding (seeds 0-7 here; no
training run was looked at). Writes experiments/results/grace_grouping.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, OrderedDict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this tree's fedlm, not whichever is installed

from fedlm import config_load  # noqa: E402
from fedlm.sim import fleet  # noqa: E402
from fedlm.engine import assemble  # noqa: E402
from fedlm.engine.dry_run import InstantTransport  # noqa: E402

FLEETS = [(4, "moderate", []), (4, "very", []), (8, "moderate", []), (8, "very", []),
          (16, "very", []), (4, "very", ["fleet.jitter=0.15"]), (8, "very", ["fleet.jitter=0.15"]),
          (8, "moderate", ["faults.hang=0.03"])]
RULES = {
    "off": ["grace=off"],
    "fixed 4 s": ["grace=4"],
    "fixed 4 s, dylu-floor": ["grace=4", "local_steps=dylu-floor"],
    "adaptive, dylu-floor": ["grace=auto", "local_steps=dylu-floor"],
    "adaptive (default)": ["grace=auto"],
    "adaptive, span 0.25": ["grace=auto", "grace_span=0.25"],
}


class Recorder:
    """A run writer that keeps the dispatches, the staleness and the idle time."""

    def __init__(self) -> None:
        self.passes: Counter = Counter()
        self.staleness: list[int] = []
        self.idle = 0.0

    def add_job(self, job, *, t_dispatch, **_) -> None:
        self.passes[(t_dispatch, job.base_version)] += 1

    def add_update(self, row) -> None:
        self.staleness.append(row["staleness"])

    def add_intervals(self, rows) -> None:
        self.idle += sum(b - a for _, kind, a, b, *_ in rows if kind.value == "idle")

    def __getattr__(self, name):  # every other write of the engine
        return lambda *a, **k: None


def one_run(workers: int, profile: str, extra: list[str], rule: list[str], seed: int) -> dict:
    cfg = config_load.load(None, [
        "strategy=delayed-nesterov", "local_steps=dylu", "inner.steps=20", "model=tiny",
        f"workers={workers}", f"profile={profile}", f"seed={seed}", "updates=1000000",
        f"local_step_budget={300 * workers}", "reliability.checkpoint_every=0",
        "reliability.max_failures=1000", *extra, *rule])
    zeros = OrderedDict(w=torch.zeros(8))
    rec = Recorder()
    nodes = fleet.node_profiles(cfg)
    engine = assemble(cfg, transport=InstantTransport(zeros, cfg), fleet=nodes, writer=rec,
                      shard_sizes=[1] * cfg.shard_count())
    engine.run(zeros)
    full = sum(n == workers for n in rec.passes.values()) / len(rec.passes)
    return {"full": full, "staleness": statistics.mean(rec.staleness),
            "idle": rec.idle / (engine.now * workers), "time": engine.now}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--smoke", action="store_true", help="the first fleet and the one with "
                    "faults, every rule, one seed; write nothing (the test suite's check)")
    args = ap.parse_args()
    fleets = FLEETS
    if args.smoke:
        fleets, args.seeds = [FLEETS[0], FLEETS[-1]], 1
    rows = []
    print(f"{'fleet':34s} {'rule':24s} {'full':>5s} {'min':>5s} {'stale':>6s} "
          f"{'idle':>6s} {'time':>6s}")
    for workers, profile, extra in fleets:
        for name, rule in RULES.items():
            runs = [one_run(workers, profile, extra, rule, s) for s in range(args.seeds)]
            row = {"workers": workers, "profile": profile, "extra": extra, "rule": name,
                   "full": statistics.mean(r["full"] for r in runs),
                   "min_full": min(r["full"] for r in runs),
                   "staleness": statistics.mean(r["staleness"] for r in runs),
                   "idle": statistics.mean(r["idle"] for r in runs),
                   "time": statistics.mean(r["time"] for r in runs)}
            rows.append(row)
            where = f"{workers} x {profile} {' '.join(extra)}"
            print(f"{where:34s} {name:24s} {row['full']:5.2f} {row['min_full']:5.2f} "
                  f"{row['staleness']:6.2f} {100 * row['idle']:5.1f}% {row['time']:6.0f}",
                  flush=True)
    text = json.dumps({"seeds": args.seeds, "rows": rows}, indent=1) + "\n"
    if args.smoke:
        print(f"smoke: {len(rows)} rows, nothing written ({len(text)} bytes of JSON)")
        return
    out = ROOT / "experiments" / "results" / "grace_grouping.json"
    out.write_text(text)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
