"""Real training with many workers: peak memory and wall time per update.

    python experiments/bench/scale.py [--workers 4 16 64 256 1000] [--concurrency 4]
    python experiments/bench/scale.py --smoke   # seconds: 3 workers, 2 in flight, 4 updates,
                                                # in-process, nothing written

Each point is a real `fedlm run` on Flower's simulation engine (tiny model,
async SGD, IID shards) with `max_in_flight` jobs in flight at once, sampled
among the free workers, and each worker's AdamW state in a file
(`inner.state_store=disk`), so that only the active workers hold a model.
A sampler reads the resident memory (RSS) of the whole process tree — the
CLI, the ServerApp, Ray and its actors — every 0.2 s. Prints a table;
writes experiments/results/scale.json.

``--smoke`` (the test suite's check) measures one tiny point and writes
nothing. It runs ``--backend inprocess`` (``--backend flower`` keeps Flower's
simulation engine): Ray's start alone would cost more than the whole smoke, and
``fedlm run`` on Flower has its own test (tests/test_flower_e2e.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tree_rss(root: int) -> int:
    """Sum of VmRSS (bytes) over ``root`` and its descendants, and Ray's processes."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pid, ppid = int(proc.name), int(fields.get("PPid", "0").strip())
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack += children.get(pid, [])
    return total


def run_point(workers: int, concurrency: int, updates: int, db: Path,
              backend: str = "flower", timeout: float | None = None) -> dict:
    cmd = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", backend, "--db", str(db)]
    for kv in [f"workers={workers}", f"max_in_flight={concurrency}", f"sim.ray_actors={concurrency}",
               "strategy=async-sgd", "model=tiny", "inner.steps=4", "inner.batch_size=4",
               "data.seq_len=64", "data.partition=iid", f"updates={updates}",
               "eval.every=1000000", "eval.batches=1", "inner.state_store=disk",
               "profile=moderate"]:
        cmd += ["--set", kv]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)  # this tree's fedlm
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop.set()
        sampler.join()
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(out[-1500:] + err[-1500:])
    conn = sqlite3.connect(db)
    w0, w1 = conn.execute("SELECT MIN(wall_time), MAX(wall_time) FROM metrics").fetchone()
    applied = conn.execute("SELECT MAX(applied_version) FROM updates").fetchone()[0]
    return {"workers": workers, "concurrency": concurrency, "updates": applied,
            "peak_rss_mb": round(peak / 2**20), "total_s": round(total, 1),
            "train_s": round(w1 - w0, 1), "s_per_update": round((w1 - w0) / applied, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="*", default=[4, 16, 64, 256, 1000])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--updates", type=int, default=200)
    ap.add_argument("--backend", choices=("flower", "inprocess"), default=None,
                    help="of the runs (default: flower; inprocess with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="the test suite's check: one tiny "
                    "point, in-process, nothing written")
    args = ap.parse_args()
    timeout = None
    if args.smoke:
        args.workers, args.concurrency, args.updates, timeout = [3], 2, 4, 300
    args.backend = args.backend or ("inprocess" if args.smoke else "flower")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.workers:
            rows.append(run_point(n, min(args.concurrency, n), args.updates,
                                  Path(tmp) / f"w{n}.db", args.backend, timeout))
            print(rows[-1], flush=True)
    print(f"\n{'workers':>8} {'in flight':>9} {'updates':>8} {'peak RSS MB':>12} "
          f"{'s/update':>9} {'total s':>8}")
    for r in rows:
        print(f"{r['workers']:>8,} {r['concurrency']:>9} {r['updates']:>8} "
              f"{r['peak_rss_mb']:>12,} {r['s_per_update']:>9.3f} {r['total_s']:>8.1f}")
    if args.smoke:
        text = json.dumps({"machine": f"{os.cpu_count()} cores", "rows": rows}, indent=2)
        print(f"smoke ({args.backend} backend): nothing written ({len(text)} bytes of JSON)")
        return
    out = ROOT / "experiments" / "results" / "scale.json"
    out.write_text(json.dumps({"machine": f"{os.cpu_count()} cores", "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
