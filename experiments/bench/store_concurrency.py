"""Many `fedlm run` processes writing one run store at once.

    python experiments/bench/store_concurrency.py [--runs 8] [--set KEY=VALUE ...]
    python experiments/bench/store_concurrency.py --store-only [--runs 16] [--seconds 10]

Starts ``--runs`` in-process runs (tiny model, ``eval.every=1`` by default, so
every update is evaluated and written) into one SQLite database at the same
moment, and while they train a probe tries to take the write lock every
20 ms without waiting: the longest stretch it could not is the longest any
writer held the lock. Reports each run's status, start and end, whether all
of them overlapped in time, the rows written per second, and the longest lock
hold; writes experiments/results/store_concurrency.json.

``--store-only`` measures the store alone: ``--runs`` processes, each a
``RunWriter`` that writes what a job writes (a job, an update, four intervals)
and flushes, as fast as it can for ``--seconds``; it reports transactions and
rows per second and the slowest flush (the wait for the lock included), to
experiments/results/store_capacity.json.

``--smoke`` (the test suite's check) does both at a tiny size: 2 runs of 2
updates, then 2 store-only writers for 1 s, with the reports in a temporary
directory (nothing under experiments/results/).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from queue import Empty

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SETS = ["model=tiny", "updates=12", "inner.steps=20", "inner.batch_size=4",
                "eval.every=1", "eval.batches=2", "eval.batch_size=8", "data.seq_len=64",
                "workers=3"]
TABLES = ("jobs", "updates", "intervals", "metrics", "events")
SMOKE_SETS = ["updates=2", "inner.steps=2", "workers=2", "eval.batches=1"]


class LockProbe(threading.Thread):
    """Tries ``BEGIN IMMEDIATE`` without waiting, every ``period`` seconds."""

    def __init__(self, db: Path, period: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.db, self.period = db, period
        self.stop = threading.Event()
        self.longest = 0.0
        self.tries = self.refused = 0

    def run(self) -> None:
        while not self.db.exists() and not self.stop.wait(self.period):
            pass
        conn = sqlite3.connect(self.db, timeout=0, isolation_level=None)
        blocked_since = None
        while not self.stop.wait(self.period):
            self.tries += 1
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
                blocked_since = None
            except sqlite3.OperationalError:  # locked (or the schema is being made)
                self.refused += 1
                now = time.monotonic()
                blocked_since = blocked_since or now
                self.longest = max(self.longest, now - blocked_since)
        conn.close()


def _hammer(db: str, seconds: float, queue) -> None:
    """One writer process of --store-only: job-shaped flushes for ``seconds``."""
    from fedlm.job import JobSpec
    from fedlm.store import IntervalKind, RunWriter

    w = RunWriter(db, name="hammer", strategy="async-sgd", local_steps="fixed", profile="p",
                  model="tiny", workers=1, seed=0, clock="virtual", config_json="{}")
    flushes, slowest, k = 0, 0.0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        job = JobSpec(job_id=k, worker=0, base_version=k, local_steps=1, data_seed=k,
                      prev_job=k - 1)
        w.add_job(job, op=2 * k, t_dispatch=float(k))
        w.add_update({"seq": k, "op": 2 * k + 1, "job_id": k, "worker": 0, "base_version": k,
                      "received_version": k, "staleness": 0, "local_steps": 1, "data_seed": k,
                      "tokens": 1, "train_loss": 1.0, "t_dispatch": float(k), "t_done": k + 1.0,
                      "wall_arrival": 0.0, "compute_seconds": 0.0, "update_hash": "h"})
        w.end_job(k, status="done", op=2 * k + 1)
        w.add_intervals([(0, kind, k + 0.0, k + 0.5, k, k) for kind in
                         (IntervalKind.DOWNLOAD, IntervalKind.COMPUTE, IntervalKind.UPLOAD,
                          IntervalKind.IDLE)])
        t0 = time.monotonic()
        w.commit()
        slowest = max(slowest, time.monotonic() - t0)
        flushes, k = flushes + 1, k + 1
    w.finish(status="finished", virtual_time=float(k), updates=k, final_hash="h")
    w.close()
    queue.put({"flushes": flushes, "rows": 7 * flushes, "slowest_flush_s": slowest})


def store_only(args) -> int:
    import multiprocessing

    sys.path.insert(0, str(ROOT))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "hammer.db")
        from fedlm.store import connect

        connect(db).close()
        procs = [ctx.Process(target=_hammer, args=(db, args.seconds, queue))
                 for _ in range(args.runs)]
        for p in procs:
            p.start()
        results = []
        deadline = time.monotonic() + args.seconds + 120
        while len(results) < len(procs):
            try:
                results.append(queue.get(timeout=1.0))
            except Empty:  # a writer that died reports nothing: say so, do not wait on
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    for p in procs:
                        p.kill()
                    raise RuntimeError(f"store-only writers: {len(results)} of {len(procs)} "
                                       f"reported; exit codes {[p.exitcode for p in procs]}")
        for p in procs:
            p.join(timeout=30)
    flushes = sum(r["flushes"] for r in results)
    report = {"writers": args.runs, "seconds": args.seconds,
              "transactions_per_second": round(flushes / args.seconds, 1),
              "rows_per_second": round(7 * flushes / args.seconds, 1),
              "slowest_flush_seconds": round(max(r["slowest_flush_s"] for r in results), 3),
              "flushes_per_writer": sorted(r["flushes"] for r in results)}
    print(json.dumps(report, indent=2))
    out = Path(args.out).with_name("store_capacity.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--store-only", action="store_true")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for all runs")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/store_concurrency.json"))
    ap.add_argument("--smoke", action="store_true", help="both modes at a tiny size, the "
                    "reports in a temporary directory (the test suite's check)")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.seconds, args.timeout = 2, 1.0, min(args.timeout, 300.0)
        args.sets = [*SMOKE_SETS, *args.sets]
        with tempfile.TemporaryDirectory() as tmp:
            args.out = str(Path(tmp) / "store_concurrency.json")
            rc = concurrent_runs(args)
            return rc or store_only(args)
    if args.store_only:
        return store_only(args)
    return concurrent_runs(args)


def concurrent_runs(args) -> int:
    sets = [*DEFAULT_SETS, *args.sets]
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "many.db"
        probe = LockProbe(db)
        probe.start()
        procs, started = [], []
        t0 = time.time()
        for k in range(args.runs):
            cmd = [sys.executable, "-m", "fedlm", "run", "--backend", "inprocess", "--quiet",
                   "--db", str(db), "--set", f"seed={k}", "--set", f"name=writer-{k}"]
            for kv in sets:
                cmd += ["--set", kv]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
            started.append(time.time())
        results = []
        try:
            for k, proc in enumerate(procs):
                left = max(1.0, args.timeout - (time.time() - t0))
                _, err = proc.communicate(timeout=left)
                results.append({"process": k, "exit": proc.returncode,
                                "stderr_tail": err.strip().splitlines()[-1:] if err else []})
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            probe.stop.set()
            probe.join(timeout=5)
        wall = time.time() - t0
        conn = sqlite3.connect(db)
        runs = [dict(zip(("id", "name", "status", "created_at", "finished_at", "error"), r))
                for r in conn.execute("SELECT id, name, status, created_at, finished_at, error"
                                      " FROM runs ORDER BY id")]
        rows = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in TABLES}
        conn.close()
    ends = [r["finished_at"] for r in runs if r["finished_at"]]
    overlap = bool(runs) and len(ends) == len(runs) and max(r["created_at"] for r in runs) < min(ends)
    report = {
        "runs": args.runs, "sets": sets, "wall_seconds": round(wall, 1),
        "finished": sum(r["status"] == "finished" for r in runs),
        "all_overlap_in_time": overlap,
        "rows_written": rows, "rows_per_second": round(sum(rows.values()) / wall, 1),
        "longest_write_lock_hold_seconds": round(probe.longest, 3),
        "lock_probe": {"tries": probe.tries, "refused": probe.refused},
        "per_run": [{"name": r["name"], "status": r["status"], "error": r["error"],
                     "start_s": round(r["created_at"] - t0, 1),
                     "end_s": round(r["finished_at"] - t0, 1) if r["finished_at"] else None}
                    for r in runs],
        "processes": results,
    }
    print(json.dumps(report, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["finished"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
