"""Client sampling at scale: the engine's cost per event as the fleet grows, and a
cross-device run of a thousand trace clients on this machine.

    python experiments/bench/sampling_scale.py [--events 100000] [--real] [--smoke]

1. The scheduling core alone (a no-op transport: every job done the moment it is
   sent, as experiments/bench/engine_throughput.py): sync FedAvg drawing K = 10% of the
   N available each round with over-commitment 1.3, at N = 100, 1,000 and 10,000
   workers; events (a dispatch and a completion per job) per second.
2. ``--real``: the `tiny` model on a FedScale-format fleet of 1,000 clients (a device and
   an availability trace, seeded, made with `fedlm trace`), K = 100 a round (a tenth of
   the available, at least 100: about a quarter of the phones are there at a time),
   over-commitment 1.3, 20 rounds, in process; its wall time, and its replay.

Writes experiments/results/sampling_scale.json (not with ``--smoke``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "bench"))

from engine_throughput import NoOpTransport  # noqa: E402

from fedlm import config_load  # noqa: E402
from fedlm.engine import assemble  # noqa: E402
from fedlm.sim import fleet  # noqa: E402

SAMPLED = ["strategy=fedavg", "outer.fraction=0.1", "outer.overcommit=1.3"]


def core(workers: int, events: int) -> dict:
    """Events per second of sampled FedAvg rounds over ``workers``, no training."""
    per_round = 2 * max(1, workers // 10) * 1.3
    rounds = max(2, int(events / per_round))
    cfg = config_load.load(None, [f"workers={workers}", *SAMPLED, "profile=very",
                                  f"updates={rounds}", "model=tiny",
                                  "eval.every=1000000000", "data.partition=iid",
                                  "local_steps=fixed"])
    engine = assemble(cfg, transport=NoOpTransport(), fleet=fleet.profiles(cfg.fleet, workers))
    t0 = time.perf_counter()
    engine.run(OrderedDict(w=torch.zeros(1)))
    seconds = time.perf_counter() - t0
    return {"workers": workers, "rounds": engine.version, "jobs_done": engine.jobs_done,
            "run_s": round(seconds, 3), "events_per_s": round(2 * engine.jobs_done / seconds),
            "rounds_per_s": round(engine.version / seconds, 2)}


def real(out: Path) -> dict:
    """A thousand trace clients, K = 100 a round, the tiny model, in process."""
    fedlm = [sys.executable, "-m", "fedlm"]
    dev, avail, db = out / "device.json", out / "avail.json", out / "r.db"
    subprocess.run([*fedlm, "trace", "device", "--clients", "1000", "--seed", "41", "--out",
                    str(dev)], check=True, capture_output=True)
    subprocess.run([*fedlm, "trace", "availability", "--clients", "1000", "--seed", "42",
                    "--out", str(avail)], check=True, capture_output=True)
    sets = ["model=tiny", "workers=1000", *SAMPLED, "outer.min_workers=100", "updates=20",
            "inner.steps=5",
            "data.partition=iid", "eval.every=5", f"fleet.device_trace={dev}",
            f"fleet.availability_trace={avail}", "fleet.trace_time_scale=0.02"]
    cmd = [*fedlm, "run", "--quiet", "--backend", "inprocess", "--db", str(db)]
    for kv in sets:
        cmd += ["--set", kv]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1]}
    t0 = time.perf_counter()
    rep = subprocess.run([*fedlm, "replay", "1", "--db", str(db)], capture_output=True,
                         text=True)
    summary = [line for line in run.stdout.splitlines() if "sampled rounds" in line]
    return {"sets": sets, "run_wall_s": round(wall, 1),
            "replay_wall_s": round(time.perf_counter() - t0, 1),
            "replay": "identical" if "identical" in rep.stdout else rep.stdout[-300:],
            "rounds": summary[0].strip() if summary else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--real", action="store_true", help="also the 1,000-client tiny run")
    ap.add_argument("--smoke", action="store_true", help="seconds: 100 and 1,000 workers")
    args = ap.parse_args()
    sizes, events = ((100, 1_000), 2_000) if args.smoke else ((100, 1_000, 10_000), args.events)
    rows = []
    for n in sizes:
        rows.append(core(n, events))
        print(rows[-1], flush=True)
    result = {"machine": f"{os.cpu_count()} cores", "core": rows}
    if args.real:
        with tempfile.TemporaryDirectory() as tmp:
            result["real"] = real(Path(tmp))
        print(result["real"], flush=True)
    if args.smoke:
        print("smoke: nothing written")
        return
    path = ROOT / "experiments" / "results" / "sampling_scale.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
