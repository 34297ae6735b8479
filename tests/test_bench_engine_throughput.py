"""The engine-throughput benchmark still runs against the engine as it is now
(it rotted once: an attribute the engine no longer had, a partition the big
fleets are refused). ``--smoke`` runs it in seconds and writes nothing."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "experiments" / "bench" / "engine_throughput.py"
RESULTS = ROOT / "experiments" / "results" / "engine_throughput.json"


def test_the_engine_throughput_benchmark_runs_and_prints_its_table():
    before = RESULTS.stat().st_mtime_ns if RESULTS.exists() else None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke"], capture_output=True,
                          text=True, timeout=240, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a row of the table: workers, strategy, store, jobs, jobs/s, events/s, updates/s, setup s
    rows = re.findall(r"^\s*([\d,]+)\s+(async-sgd|fedavg)\s+(True|False)\s+([\d,]+)\s+[\d,]+"
                      r"\s+[\d,]+\s+[\d,.]+\s+[\d.]+$", proc.stdout, re.M)
    assert len(rows) == 8, proc.stdout
    assert {(w, s) for w, s, _, _ in rows} == {("10", "async-sgd"), ("10", "fedavg"),
                                              ("100", "async-sgd"), ("100", "fedavg")}
    assert (RESULTS.stat().st_mtime_ns if RESULTS.exists() else None) == before  # nothing written
