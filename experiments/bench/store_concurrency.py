"""Many `fedlm run` processes writing one run store at once.

    python experiments/bench/store_concurrency.py [--runs 8] [--set KEY=VALUE ...]

Starts ``--runs`` in-process runs (tiny model, ``eval.every=1`` by default, so
every update is evaluated and written) into one SQLite database at the same
moment, and while they train a probe tries to take the write lock every
20 ms without waiting: the longest stretch it could not is the longest any
writer held the lock. Reports each run's status, start and end, whether all
of them overlapped in time, the rows written per second, and the longest lock
hold; writes experiments/results/store_concurrency.json.
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

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SETS = ["model=tiny", "updates=12", "inner.steps=20", "inner.batch_size=4",
                "eval.every=1", "eval.batches=2", "eval.batch_size=8", "data.seq_len=64",
                "workers=3"]
TABLES = ("jobs", "updates", "intervals", "metrics", "events")


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for all runs")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/store_concurrency.json"))
    args = ap.parse_args()
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
