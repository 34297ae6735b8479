"""Many writers, one run store: concurrent `fedlm run` processes all finish, at once."""

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedlm import store
from fedlm.runner import run_inprocess
from tests._processes import run_at_once
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parent.parent
SETS = ["model=tiny", "workers=3", "updates=6", "inner.steps=12", "inner.batch_size=4",
        "eval.every=1", "eval.batches=2", "eval.batch_size=8", "data.seq_len=64"]


def _run_cmd(db: Path, seed: int) -> list[str]:
    cmd = [sys.executable, "-m", "fedlm", "run", "--backend", "inprocess", "--quiet",
           "--db", str(db), "--set", f"seed={seed}", "--set", f"name=writer-{seed}"]
    for kv in SETS:
        cmd += ["--set", kv]
    return cmd


def test_concurrent_runs_write_one_store_at_once(tmp_path):
    sys.path.insert(0, str(ROOT / "experiments" / "bench"))
    from store_concurrency import LockProbe

    db = tmp_path / "many.db"
    store.connect(db).close()
    probe = LockProbe(db, period=0.01)
    probe.start()
    try:
        results = run_at_once([_run_cmd(db, k) for k in range(4)], timeout=300, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finally:
        probe.stop.set()
        probe.join(timeout=10)
    assert [rc for rc, _, _ in results] == [0] * 4, [err for _, _, err in results]
    runs = store.list_runs(db)
    assert [r["status"] for r in runs] == ["finished"] * 4
    # they trained side by side, not one after another
    assert max(r["created_at"] for r in runs) < min(r["finished_at"] for r in runs)
    # no writer held the lock across a job or an evaluation (each takes far longer)
    assert probe.tries > 50 and probe.longest < 1.0, probe.longest
    # and a run trained beside others is the run trained alone
    alone = tmp_path / "alone.db"
    run_inprocess(tiny_config(*SETS, "seed=2", "name=writer-2"), str(alone))
    by_name = {r["name"]: r["final_hash"] for r in runs}
    assert by_name["writer-2"] == store.list_runs(alone)[0]["final_hash"]


def test_a_writer_waits_for_the_lock_instead_of_failing(tmp_path, monkeypatch):
    """Another connection holds the write lock for a while: the flush backs off and
    gets through once it is released (within FEDLM_DB_TIMEOUT)."""
    monkeypatch.setenv("FEDLM_DB_TIMEOUT", "20")
    db = tmp_path / "w.db"
    writer = store.RunWriter(db, name="t", strategy="diloco", local_steps="fixed",
                             profile="p", model="tiny", workers=1, seed=0, clock="virtual",
                             config_json="{}")
    holder = sqlite3.connect(db, isolation_level=None, timeout=0, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(1.5, holder.execute, ("COMMIT",))
    release.start()
    try:
        writer.add_event(kind="x", virtual_time=0.0)
        t0 = time.monotonic()
        writer.commit()
        waited = time.monotonic() - t0
    finally:
        release.join()
        holder.close()
    writer.finish(status="finished", virtual_time=1.0, updates=0, final_hash="h")
    writer.close()
    assert 1.0 < waited < 15
    assert store.list_runs(db)[0]["status"] == "finished"


def test_a_failed_run_is_recorded_even_when_its_rows_cannot_be(tmp_path, monkeypatch):
    """The writer's own flush gives up (the lock held past FEDLM_DB_TIMEOUT); the end
    of the run is still written, through a fresh connection, once the lock is free."""
    monkeypatch.setenv("FEDLM_DB_TIMEOUT", "0.5")
    db = tmp_path / "s.db"
    writer = store.RunWriter(db, name="t", strategy="diloco", local_steps="fixed",
                             profile="p", model="tiny", workers=1, seed=0, clock="virtual",
                             config_json="{}")
    writer.add_event(kind="x", virtual_time=0.0)
    holder = sqlite3.connect(db, isolation_level=None, timeout=0)
    holder.execute("BEGIN IMMEDIATE")
    # released while the writer's own attempt has given up and the fresh one retries
    original = store.writer.mark_ended  # what RunWriter.finish calls

    def release_then_mark(*args, **kwargs):
        holder.execute("COMMIT")
        return original(*args, **kwargs)

    monkeypatch.setattr(store.writer, "mark_ended", release_then_mark)
    try:
        writer.finish(status="failed", virtual_time=0.0, updates=0, final_hash=None,
                      error="RuntimeError: boom")
    finally:
        holder.close()
        writer.close()
    (run,) = store.list_runs(db)
    assert run["status"] == "failed"
    assert run["error"].startswith("RuntimeError: boom (and its last rows were not written")


@pytest.mark.parametrize("jobs", [1, 3])
def test_many_processes_create_one_new_store_at_once(tmp_path, jobs):
    """The schema is made once even when several writers open a new file together."""
    db = tmp_path / "new.db"
    code = ("import sys; from fedlm import store; store.connect(sys.argv[1]).close()")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(db)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for _ in range(jobs * 2)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), errors
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM meta WHERE key='store_id'").fetchone() == (1,)


def test_a_new_store_appears_whole(tmp_path, monkeypatch):
    """Readers never see a store without its tables: it is made under another name
    and linked into place (a reader used to get "not a fedlm run database")."""
    from fedlm.store import schema

    db = tmp_path / "new.db"
    seen = []
    real = schema.create_or_migrate

    def watching(conn):
        seen.append(db.exists())  # while the tables are being made
        return real(conn)

    monkeypatch.setattr(schema, "create_or_migrate", watching)
    store.connect(db).close()
    assert seen[0] is False and store.list_runs(db) == []
    assert not [p for p in tmp_path.iterdir() if "creating" in p.name]  # nothing left over
