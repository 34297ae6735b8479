"""The scheduling core alone: events and virtual updates per second.

    python experiments/bench/engine_throughput.py [--events 200000] [--repeat 1] [--smoke]

A no-op transport answers every job at once with a one-number outer gradient,
so what is measured is fedlm's engine: the virtual clock, dispatch, the
strategy call, bookkeeping. For 10, 1,000 and 100,000 simulated workers
(async SGD: one update per finished job; FedAvg: one per round), with and
without the SQLite run store (at 100,000 workers without it only). Each case
finishes ``--events`` jobs, or twice the workers if that is more. Prints a
table; writes experiments/results/engine_throughput.json. ``--repeat N``: each
case N times, its fastest kept (a machine shared with other work). ``--smoke``: a
seconds-long version (few jobs, 10 and 100 workers) that writes nothing, for
tests/test_bench_engine_throughput.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fedlm import config_load  # noqa: E402
from fedlm.sim import fleet  # noqa: E402
from fedlm.engine import JobResult, assemble  # noqa: E402
from fedlm.store import RunWriter  # noqa: E402


class NoOpTransport:
    """Every job is done the moment it is submitted."""

    def __init__(self) -> None:
        self.ready: list[JobResult] = []
        self.grad = OrderedDict(w=torch.zeros(1))

    def submit(self, job, params) -> None:
        self.ready.append(JobResult(job.job_id, self.grad, steps=job.local_steps, tokens=1,
                                train_loss=0.0))

    def collect(self, timeout: float) -> list[JobResult]:
        out, self.ready = self.ready, []
        return out


def measure(workers: int, strategy: str, events: int, store: bool) -> dict:
    updates = events if strategy == "async-sgd" else max(1, events // workers)
    cfg = config_load.load(None, [f"workers={workers}", f"strategy={strategy}", "profile=very",
                                  f"updates={updates}", "model=tiny", "eval.every=1000000000",
                                  "data.partition=iid", "local_steps=fixed"])
    t0 = time.perf_counter()
    profiles = fleet.profiles(cfg.fleet, workers)
    with tempfile.TemporaryDirectory() as tmp:
        writer = None
        if store:
            writer = RunWriter(Path(tmp) / "b.db", name="bench", strategy=strategy,
                               local_steps="fixed", profile="very", model="tiny",
                               workers=workers, seed=0, clock="virtual",
                               config_json=cfg.to_json())
        engine = assemble(cfg, transport=NoOpTransport(), fleet=profiles, writer=writer)
        setup = time.perf_counter() - t0
        t1 = time.perf_counter()
        engine.run(OrderedDict(w=torch.zeros(1)))
        seconds = time.perf_counter() - t1
        if writer:
            writer.close()
    done = engine.jobs_done
    return {"workers": workers, "strategy": strategy, "store": store, "jobs": done,
            "versions": engine.version, "setup_s": round(setup, 3), "run_s": round(seconds, 3),
            "events_per_s": round(2 * done / seconds),  # a dispatch and a completion per job
            "jobs_per_s": round(done / seconds),
            "updates_per_s": round(engine.version / seconds, 1),
            "virtual_s_per_wall_s": round(engine.events.now / seconds, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000, help="jobs to finish per case")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each case this many times and keep its fastest")
    ap.add_argument("--smoke", action="store_true",
                    help="a seconds-long check that it runs: 200 jobs at 10 and 100 workers, "
                         "nothing written")
    args = ap.parse_args()
    fleets, events = ((10, 100), 200) if args.smoke else ((10, 1_000, 100_000), args.events)
    rows = []
    for workers in fleets:
        for strategy in ("async-sgd", "fedavg"):
            for store in (False, True):
                if store and workers == 100_000:
                    continue  # the store's cost per job does not depend on the fleet size
                runs = [measure(workers, strategy, max(events, 2 * workers), store)
                        for _ in range(max(1, args.repeat))]
                rows.append(max(runs, key=lambda r: r["events_per_s"]))
                print(rows[-1], flush=True)
    print(f"\n{'workers':>8} {'strategy':>10} {'store':>6} {'jobs':>8} {'jobs/s':>9} "
          f"{'events/s':>9} {'updates/s':>10} {'setup s':>8}")
    for r in rows:
        print(f"{r['workers']:>8,} {r['strategy']:>10} {str(r['store']):>6} {r['jobs']:>8,} "
              f"{r['jobs_per_s']:>9,} {r['events_per_s']:>9,} {r['updates_per_s']:>10,} "
              f"{r['setup_s']:>8.2f}")
    if args.smoke:
        return
    out = ROOT / "experiments" / "results" / "engine_throughput.json"
    machine = f"{os.cpu_count()} cores" + (f", best of {args.repeat} runs" if args.repeat > 1
                                          else "")
    out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
