"""Two sweeps on one store share the cells: each is trained once (fedlm.sweep.claims),
and a sweep killed outright takes its runs with it, so that a rerun trains each cell once."""

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from fedlm import ownership, store
from fedlm.sweep import claims
from tests._processes import run_at_once

SPEC = """
db = "{db}"
out = "{out}"
profiles = ["very"]
seeds = [0, 1]
base = ["model=tiny", "workers=2", "updates=2", "inner.steps=2", "inner.batch_size=2",
        "eval.batches=1", "eval.batch_size=2", "data.seq_len=32"]
[[arm]]
label = "sync"
reference = true
set = ["strategy=diloco"]
[[arm]]
label = "async"
set = ["strategy=async-sgd"]
"""


def test_a_claim_is_one_processs_and_a_dead_owners_claim_is_taken_over(tmp_path):
    db = tmp_path / "s.db"
    mine = claims.take(db, "cell @ very seed 0")
    assert mine is not None
    assert claims.take(db, "cell @ very seed 0") is None  # held by a live process (this one)
    assert claims.held_elsewhere(db, "cell @ very seed 0")
    mine.release()
    assert not claims.held_elsewhere(db, "cell @ very seed 0")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    path = claims._path(db, "other")
    path.write_text(json.dumps({"host": __import__("socket").gethostname(),
                                "pid": int(dead), "started": 0.0, "at": 0.0}))
    taken = claims.take(db, "other")  # its owner is gone: a claim of nobody's
    assert taken is not None
    taken.release()


def test_two_sweeps_at_once_on_one_store_train_each_cell_once(tmp_path):
    db, out = tmp_path / "s.db", tmp_path / "s.md"
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(db=db, out=out))
    cmd = [sys.executable, "-m", "fedlm", "sweep", str(spec), "--backend", "inprocess"]
    results = run_at_once([cmd, cmd], timeout=400, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    outs = [out for _, out, _ in results]
    assert [rc for rc, _, _ in results] == [0, 0], outs
    names = [r["name"] for r in store.list_runs(db)]
    assert len(names) == 4 == len(set(names)), names  # 2 arms x 2 seeds, each once
    assert sum("another sweep is training it" in o or "by another sweep" in o
               for o in outs) >= 1  # they met
    assert not claims.folder_of(db).exists()


def _claim_of(db, name, host, at) -> Path:
    path = claims._path(db, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name, "host": host, "pid": 1, "started": 0.0,
                                "at": at}))
    return path


def _age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_claim_from_another_host_is_live_while_its_heartbeat_is_fresh(tmp_path):
    db = tmp_path / "s.db"
    # taken an hour ago by a sweep on another host, touched just now: its owner is alive
    path = _claim_of(db, "cell", "another-host.example", at=time.time() - 3600)
    assert claims.take(db, "cell") is None and claims.held_elsewhere(db, "cell")
    _age(path, ownership.STALE_AFTER - 5)
    assert claims.take(db, "cell") is None
    _age(path, ownership.STALE_AFTER + 5)  # silent past the bound: its owner is gone
    assert not claims.held_elsewhere(db, "cell")
    taken = claims.take(db, "cell")
    assert taken is not None
    assert json.loads(path.read_text())["host"] == socket.gethostname()
    taken.release()
    assert not path.exists()


def test_an_unreadable_claim_is_judged_by_its_heartbeat(tmp_path):
    db = tmp_path / "s.db"
    path = claims._path(db, "cell")
    path.parent.mkdir()
    path.write_text("")  # just made with O_EXCL, its owner about to write it
    assert claims.take(db, "cell") is None
    _age(path, ownership.STALE_AFTER + 5)  # left so by an owner killed at that instant
    claims.take(db, "cell").release()


def test_the_owner_keeps_its_claim_fresh_and_releases_only_its_own(tmp_path):
    db = tmp_path / "s.db"
    mine = claims.take(db, "cell")
    _age(mine.path, 3600)
    deadline = time.monotonic() + 5 * ownership.HEARTBEAT_EVERY
    while time.time() - mine.path.stat().st_mtime > ownership.STALE_AFTER:
        assert time.monotonic() < deadline, "the claim's heartbeat did not refresh it"
        time.sleep(0.05)  # polling the claim file, a bounded wait
    # judged dead from another host meanwhile, and taken over: the taker's stays
    mine.path.unlink()
    theirs = _claim_of(db, "cell", "another-host.example", at=time.time())
    mine.release()
    assert theirs.exists()


# -- kill -9 of a sweep: its runs die with it; run again, each cell trains once --

KILL_SPEC = SPEC.replace('seeds = [0, 1]\n', '').replace('"updates=2"', '"updates=6"')


def _running(db) -> list[tuple[int, float]]:
    """(PID, process start time) of the writers of the runs being written now."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT owner_pid, owner_started FROM runs "
                                "WHERE status='running'").fetchall()
    except sqlite3.OperationalError:  # not made yet, or its schema being made
        return []


def test_a_sweep_killed_outright_takes_its_runs_with_it_and_a_rerun_trains_each_cell_once(
        tmp_path):
    db, out, spec = tmp_path / "s.db", tmp_path / "s.md", tmp_path / "s.toml"
    spec.write_text(KILL_SPEC.format(db=db, out=out))
    cmd = [sys.executable, "-m", "fedlm", "sweep", str(spec), "--backend", "inprocess",
           "--jobs", "2"]
    sweep = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)  # its group: cleaned up below
    try:
        deadline = time.monotonic() + 120
        while len(children := _running(db)) < 2:
            assert sweep.poll() is None, sweep.stderr.read()
            assert time.monotonic() < deadline, "two runs did not start in 120 s"
            time.sleep(0.05)  # polling the sweep's store, a bounded wait
        sweep.kill()  # SIGKILL: no handler of the sweep runs
        sweep.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive := [pid for pid, started in children if ownership.pid_alive(pid, started)]:
            assert time.monotonic() < deadline, f"runs {alive} outlived their sweep"
            time.sleep(0.05)  # polling the process table, a bounded wait
    finally:
        try:
            os.killpg(sweep.pid, signal.SIGKILL)  # whatever of it is left, if the test failed
        except ProcessLookupError:
            pass
        sweep.wait()
    assert sorted(r["status"] for r in store.list_runs(db)) == ["crashed"] * 2  # mid-run
    assert len(list(claims.folder_of(db).iterdir())) == 2  # left behind, owner gone
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    runs = sorted((r["name"], r["status"]) for r in store.list_runs(db))
    assert runs == [("async @ very", "crashed"), ("async @ very", "finished"),
                    ("sync @ very", "crashed"), ("sync @ very", "finished")], runs
    assert not claims.folder_of(db).exists()
