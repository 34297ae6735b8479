"""SIGTERM (or Ctrl-C) ends `fedlm run` cleanly: the run is kept, marked
interrupted, the command exits 130, and no process it started outlives it."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.test_deploy import _processes_mentioning

SETS = ["model=tiny", "workers=2", "updates=1000", "inner.steps=5", "eval.every=1000",
        "eval.batches=1", "data.seq_len=64"]


def _applied(db) -> int:
    """Global versions made so far (the run's ``updates``; a sync round of two workers
    applies two update rows at once, one version)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT coalesce(max(applied_version), 0) "
                                "FROM updates").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


# On Flower the run is a plug-in strategy loaded by dotted path from examples/
# (FedAsync, async): so this run also shows a plug-in running end to end on Flower's
# simulation engine (it was a Flower run of its own in test_contract).
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PLUGIN = "fedasync_example:FedAsync"


@pytest.mark.parametrize("backend", ["inprocess",
                                     pytest.param("flower", marks=pytest.mark.flower)])
def test_sigterm_marks_the_run_interrupted_and_leaves_nothing_running(tmp_path, backend):
    db, mark = tmp_path / "runs.db", f"FEDLM_TEST_MARK={uuid.uuid4().hex}"
    args = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", backend,
            "--db", str(db)]
    for kv in SETS + ([f"strategy={PLUGIN}"] if backend == "flower" else []):
        args += ["--set", kv]
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1],
           "PYTHONPATH": os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        deadline = time.monotonic() + 240
        while _applied(db) < 2:
            assert run.poll() is None, run.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no second version within 240 s"
            time.sleep(0.2)
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, out[-3000:]
    assert "interrupted" in out
    with sqlite3.connect(db) as conn:
        status, updates, strategy = conn.execute("SELECT status, updates, strategy"
                                                 " FROM runs").fetchone()
    assert status == "interrupted" and updates >= 2
    assert strategy == (PLUGIN if backend == "flower" else "diloco")
    # Ray's GCS, raylet and ClientApp actors carry the command's environment
    assert _processes_mentioning(mark) == []


STUCK = '''import os, pathlib, time
from fedlm.strategies.diloco import DiLoCo

class Sleeps(DiLoCo):  # blocked in C: only a signal cuts it short
    def on_update(self, *a, **k):
        pathlib.Path(os.environ["STUCK_ENTERED"]).touch()
        time.sleep(3600)

class Spins(DiLoCo):  # never reaches the engine's next step
    def on_update(self, *a, **k):
        pathlib.Path(os.environ["STUCK_ENTERED"]).touch()
        while True:
            pass
'''


def _status(db):
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            row = conn.execute("SELECT status FROM runs").fetchone()
    except sqlite3.OperationalError:
        return None
    return row and row[0]


@pytest.mark.parametrize("backend, hook", [
    ("inprocess", "Sleeps"),  # the engine in the main thread: the signal handler raises
    ("inprocess", "Spins"),
])
def test_a_run_stuck_in_a_plugin_is_made_to_stop_within_the_grace(tmp_path, backend, hook):
    """SIGTERM to a run whose strategy hook never returns: the engine never reaches its
    next step, so after ``STOP_GRACE_S`` the stop is raised where the engine is; the run
    is marked interrupted, the command exits 130, nothing of it is left running."""
    from fedlm.interrupts import STOP_GRACE_S

    (tmp_path / "stuck_plugin.py").write_text(STUCK)
    db, mark = tmp_path / "runs.db", f"FEDLM_TEST_MARK={uuid.uuid4().hex}"
    args = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", backend,
            "--db", str(db), "--set", f"strategy=stuck_plugin:{hook}"]
    for kv in ["model=tiny", "workers=2", "updates=3", "inner.steps=2", "data.seq_len=64"]:
        args += ["--set", kv]
    entered = tmp_path / "entered"
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1], "STUCK_ENTERED": str(entered),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        deadline = time.monotonic() + 240
        while not entered.exists():
            assert run.poll() is None, run.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no update reached the strategy in 240 s"
            time.sleep(0.2)
        run.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        out, _ = run.communicate(timeout=STOP_GRACE_S + 60)
        took = time.monotonic() - sent
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, out[-3000:]
    assert STOP_GRACE_S - 1 <= took <= STOP_GRACE_S + 45, took
    assert _status(db) == "interrupted"
    assert _processes_mentioning(mark) == []



def test_an_overdue_stop_is_raised_in_the_thread_that_asks_whatever_it_is_doing():
    """On Flower the engine runs in the ServerApp's thread, not the main one: an overdue
    stop is raised there, at its next line of Python (a loop that never returns too)."""
    import threading

    from fedlm.interrupts import stop_on_signals

    class Overdue(Exception):
        pass

    caught, asked = [], threading.Event()

    def engine(stop) -> None:
        try:
            stop.is_set()  # the engine's thread asks once, as at each step
            asked.set()
            while True:  # then never reaches its next step
                pass
        except Overdue:
            caught.append(threading.get_ident())

    with stop_on_signals(overdue=Overdue, grace=0.3) as stop:
        thread = threading.Thread(target=engine, args=(stop,), daemon=True)
        thread.start()
        assert asked.wait(10)
        os.kill(os.getpid(), signal.SIGTERM)  # the first signal: a stop is asked for
        thread.join(timeout=10)
    assert not thread.is_alive() and caught == [thread.ident]
