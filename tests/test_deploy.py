"""Flower's deployment engine on loopback: SuperLink + SuperNodes, real arrival order."""

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.flower


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "environ").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def test_deploy_local_runs_replays_and_cleans_up(tmp_path):
    home, db = tmp_path / "flwr-home", tmp_path / "runs.db"
    args = [sys.executable, "-m", "fedlm", "deploy", "local", "--workers", "2", "--db", str(db),
            "--home", str(home)]
    for kv in ["model=tiny", "updates=2", "inner.steps=3", "eval.batches=2", "data.seq_len=64",
               "strategy=async-sgd"]:
        args += ["--set", kv]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "wall-clock time" in out.stdout
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status, mode FROM runs").fetchone() == ("finished", "wall")
    nodes = [n for (n,) in conn.execute("SELECT node_id FROM workers")]
    assert len(set(nodes)) == 2
    replay = subprocess.run([sys.executable, "-m", "fedlm", "replay", "1", "--db", str(db)],
                            capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0 and "identical" in replay.stdout, replay.stdout
    # every SuperLink, SuperNode and SuperExec started for the run is gone
    assert _processes_mentioning(str(home)) == []
