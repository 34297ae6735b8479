"""Runs owned by a live process: a dead writer's run reads as crashed, a live one
cannot be resumed, and a resume never loads another run's checkpoint."""

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from fedlm.dashboard import queries
from fedlm import checkpoint, ownership, store
from fedlm.runner import run_inprocess
from tests.conftest import tiny_config
from tests.test_resume import BASE, _fedlm, _kill_when

RUN = [*BASE, "strategy=diloco"]


def _start(db, *sets: str) -> subprocess.Popen:
    args = _fedlm("run", "--backend", "inprocess", "--quiet", "--db", str(db))
    for kv in [*RUN, *sets]:
        args += ["--set", kv]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(_fedlm(*args), capture_output=True, text=True, timeout=timeout)


def _hash(db) -> str:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT final_hash FROM runs").fetchone()[0]


def test_liveness_is_judged_by_the_process_table_here_and_the_heartbeat_elsewhere():
    here, me = socket.gethostname(), ownership.current()
    now = time.time()
    assert ownership.judge(here, me.pid, me.started, None, now).alive
    # the same PID, started at another time: reused by a later process
    assert not ownership.judge(here, me.pid, me.started - 1000, now, now).alive
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not ownership.judge(here, child.pid, None, now, now).alive  # gone
    # another host: only the heartbeat tells
    assert ownership.judge("elsewhere", 1, 0.0, now - 5, now).alive
    stale = ownership.judge("elsewhere", 1, 0.0, now - ownership.STALE_AFTER - 1, now)
    assert not stale.alive and "last heartbeat" in stale.why
    assert not ownership.judge(None, None, None, None, now).alive  # no writer recorded


def test_a_writer_beats_while_it_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(ownership, "HEARTBEAT_EVERY", 0.05)
    db = tmp_path / "h.db"
    writer = store.RunWriter(db, name="t", strategy="diloco", local_steps="fixed",
                             profile="p", model="tiny", workers=1, seed=0, clock="virtual",
                             config_json="{}")
    first = store.list_runs(db)[0]["heartbeat_at"]
    deadline = time.monotonic() + 10
    while store.list_runs(db)[0]["heartbeat_at"] == first:
        assert time.monotonic() < deadline, "no heartbeat in 10 s"
        time.sleep(0.05)  # polling the store, a bounded wait
    writer.finish(status="finished", virtual_time=0.0, updates=0, final_hash="h")
    writer.close()


def test_a_writer_taken_over_writes_no_more(tmp_path):
    db = tmp_path / "t.db"
    writer = store.RunWriter(db, name="t", strategy="diloco", local_steps="fixed",
                             profile="p", model="tiny", workers=1, seed=0, clock="virtual",
                             config_json="{}")
    writer.add_event(kind="before", virtual_time=0.0)
    writer.commit()
    with sqlite3.connect(db) as conn:  # what a --resume elsewhere does
        conn.execute("UPDATE runs SET owner_host='elsewhere', owner_pid=7 WHERE id=1")
    writer.add_event(kind="after", virtual_time=1.0)
    with pytest.raises(store.StoreError, match="taken over by pid 7 on elsewhere"):
        writer.commit()
    writer.close()
    with sqlite3.connect(db) as conn:
        assert [k for (k,) in conn.execute("SELECT kind FROM events")] == ["before"]


def test_a_live_run_cannot_be_resumed_and_a_killed_one_reads_as_crashed(tmp_path):
    db = tmp_path / "live.db"
    proc = _start(db, "updates=400", "reliability.checkpoint_every=0")
    try:
        deadline = time.monotonic() + 120
        while not (_created(db) and store.list_runs(db) and
                   store.list_runs(db)[0]["updates"] is None and _applied(db) >= 1):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)  # polling the run's database, a bounded wait
        assert store.list_runs(db)[0]["status"] == "running"
        out = _cli("run", "--resume", "1", "--backend", "inprocess", "--db", str(db))
        assert out.returncode == 2 and "is still running" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
        # the take-over itself refuses too (two `--resume` racing past the first check)
        with pytest.raises(store.StoreError, match="still running"):
            store.RunWriter.reopen(db, 1)
        t_kill = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # every reader tells at once, without waiting for the heartbeat to go stale
    assert store.list_runs(db)[0]["status"] == "crashed"
    assert store.summarize(db, 1).status == "crashed"
    assert queries.runs(db)["status"].tolist() == ["crashed"]
    assert queries.headline(db, 1)["status"] == "crashed"
    assert time.monotonic() - t_kill < 5
    listed = _cli("runs", "--db", str(db))
    assert " crashed " in listed.stdout
    shown = _cli("show", "1", "--db", str(db))
    assert shown.returncode == 1 and "crashed: its writer (pid" in shown.stderr
    assert "last seen" in shown.stderr and "--resume 1" in shown.stderr


def _created(db) -> bool:
    """The run's store exists and has its tables (the file appears a moment before)."""
    if not db.exists():
        return False
    try:
        store.list_runs(db)
    except store.StoreError:
        return False
    return True


def _applied(db) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT COALESCE(MAX(applied_version), 0) FROM updates").fetchone()[0]


def test_stores_side_by_side_keep_their_checkpoints_apart(tmp_path):
    """x.db and x.sqlite in one folder: each run resumes from its own checkpoints, and
    a checkpoint of the other put in a run's folder is refused, never loaded."""
    ref = tmp_path / "reference.db"
    run_inprocess(tiny_config(*RUN), str(ref))
    mine, other = tmp_path / "x.db", tmp_path / "x.sqlite"
    for db, sets, version in ((mine, (), 7), (other, ("seed=1",), 11)):
        proc = _start(db, *sets)
        _kill_when(db, proc, version=version)
    assert checkpoint.folder_for(mine, 1) != checkpoint.folder_for(other, 1)
    theirs = sorted(checkpoint.folder_for(other, 1).glob("ckpt-v*.pt"))[-1]
    planted = checkpoint.folder_for(mine, 1) / theirs.name  # newer than any of run 1's own
    shutil.copy(theirs, planted)
    with sqlite3.connect(mine) as conn:
        before = conn.execute("SELECT COUNT(*) FROM updates").fetchone()[0]

    out = _cli("run", "--resume", "1", "--backend", "inprocess", "--quiet", "--db", str(mine))
    assert out.returncode == 2, out.stderr
    assert f"belongs to run 1 of {other.resolve()}" in out.stderr
    assert "refusing to load it" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    with sqlite3.connect(mine) as conn:  # refused before anything changed
        assert conn.execute("SELECT COUNT(*) FROM updates").fetchone()[0] == before
    assert store.list_runs(mine)[0]["status"] == "crashed"

    planted.unlink()
    out = _cli("run", "--resume", "1", "--backend", "inprocess", "--quiet", "--db", str(mine))
    assert out.returncode == 0, out.stderr[-2000:]
    assert _hash(mine) == _hash(ref)
