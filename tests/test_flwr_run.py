"""A Flower user's `flwr run .` runs fedlm's ServerApp and ClientApp from pyproject."""

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.flower
ROOT = Path(__file__).resolve().parent.parent


def _pids_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def test_flwr_run_dot(tmp_path):
    home = tmp_path / "flwr-home"
    db = tmp_path / "runs.db"
    (tmp_path / "rc.toml").write_text(
        'set = "model=tiny workers=2 updates=2 inner.steps=3 eval.batches=2 data.seq_len=64"\n'
        f'db = "{db}"\n')
    env = {**os.environ, "FLWR_HOME": str(home),
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    try:
        out = subprocess.run(
            ["flwr", "run", ".", "--run-config", str(tmp_path / "rc.toml"),
             "--federation-config", "num-supernodes=2", "--stream"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        deadline = time.monotonic() + 60  # --stream may return just before the commit lands
        status = None
        while time.monotonic() < deadline:
            if db.exists():
                row = sqlite3.connect(db).execute("SELECT status FROM runs").fetchone()
                status = row and row[0]
                if status == "finished":
                    break
            time.sleep(0.5)
        assert status == "finished", out.stdout[-2000:]
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT COUNT(*) FROM updates").fetchone()[0] == 2 * 2
    finally:
        # `flwr run` leaves a detached local SuperLink behind: stop it by PID.
        for pid in _pids_mentioning(str(home)):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
