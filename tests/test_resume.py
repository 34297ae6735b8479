"""Checkpoints and `fedlm run --resume`: a SIGKILLed run continues to the same weights."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedlm import checkpoint, start as start_lib, store
from fedlm.runner import run_inprocess
from tests.conftest import tiny_config

BASE = ["model=tiny", "workers=3", "updates=16", "inner.steps=3", "inner.batch_size=4",
        "eval.every=4", "eval.batches=2", "eval.batch_size=8", "data.seq_len=64",
        "reliability.checkpoint_every=2"]
FAULTY = ["strategy=delayed-nesterov", "local_steps=dylu-online", "fleet.preset=very",
          "faults.crash=0.1", "faults.hang=0.1", "faults.nan=0.05", "faults.duplicate=0.1",
          "faults.offline=0.1", "faults.offline_seconds=15",
          "network.server_up=3e6", "network.daily_amplitude=0.3"]  # flows in flight, too


def _fedlm(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedlm", *args]


def _applied_version(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            row = conn.execute("SELECT MAX(applied_version) FROM updates").fetchone()
    except sqlite3.OperationalError:  # schema not created yet
        return 0
    return row[0] or 0


def _kill_when(db: Path, proc: subprocess.Popen, version: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while _applied_version(db) < version:
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, f"version {version} not reached in {timeout} s"
        time.sleep(0.05)  # polling the run's database, a bounded wait
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


# The paper's framework: shards drawn by the under-sampled rule, per-shard schedules
# and a pretrained start (the shard book's counts and draw are in the checkpoint).
PAPER = ["strategy=delayed-nesterov", "local_steps=dylu", "fleet.preset=very",
         "data.partition=iid", "data.shards=5", "data.shard_choice=paper",
         "inner.schedule=shard", "init.pretrain_steps=10"]


@pytest.mark.parametrize("extra,corrupt", [(["strategy=diloco"], True), (FAULTY, False),
                                           (PAPER, False)],
                         ids=["diloco-corrupt-newest-checkpoint", "async-dylu-with-faults",
                              "paper-shards-schedule-pretrained"])
def test_killed_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, extra, corrupt):
    sets = [*BASE, *extra]
    ref_db = tmp_path / "reference.db"
    run_inprocess(tiny_config(*sets), str(ref_db))
    with sqlite3.connect(ref_db) as conn:
        ref_hash = conn.execute("SELECT final_hash FROM runs").fetchone()[0]

    db = tmp_path / "killed.db"
    args = _fedlm("run", "--backend", "inprocess", "--quiet", "--db", str(db))
    for kv in sets:
        args += ["--set", kv]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    _kill_when(db, proc, version=7)
    with sqlite3.connect(db) as conn:  # killed: nobody marked it
        assert conn.execute("SELECT status FROM runs").fetchone()[0] == "running"
    assert store.list_runs(db)[0]["status"] == "crashed"  # but its writer is gone
    folder = checkpoint.folder_for(db, 1)
    saved = sorted(folder.glob("ckpt-v*.pt"))
    assert saved, "no checkpoint was written"
    if corrupt:  # a torn write of the newest one: resume must fall back to the one before
        newest = saved[-1]
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])

    out = subprocess.run(_fedlm("run", "--resume", "1", "--backend", "inprocess", "--quiet",
                                "--db", str(db)), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    with sqlite3.connect(db) as conn:
        status, final_hash = conn.execute("SELECT status, final_hash FROM runs").fetchone()
        kinds = {k for (k,) in conn.execute("SELECT kind FROM events")}
        updates = conn.execute("SELECT COUNT(*) FROM updates").fetchone()[0]
        ref_updates = sqlite3.connect(ref_db).execute("SELECT COUNT(*) FROM updates").fetchone()[0]
    assert status == "finished"
    assert final_hash == ref_hash  # bit-identical to the run that was never killed
    assert updates == ref_updates  # the log was cut back to the checkpoint, not doubled
    assert "resumed" in kinds
    assert ("checkpoint_skipped" in kinds) == corrupt
    assert not folder.exists()  # a finished run's checkpoints are removed

    replay = subprocess.run(_fedlm("replay", "1", "--db", str(db)), capture_output=True,
                            text=True, timeout=300)
    assert replay.returncode == 0 and "identical" in replay.stdout, replay.stdout


def test_an_interrupted_run_cancels_its_jobs_and_resumes_to_the_same_weights(tmp_path):
    from fedlm.engine import Interrupted

    sets = [*BASE, "strategy=async-sgd", "fleet.preset=very"]
    ref_db, db = tmp_path / "reference.db", tmp_path / "stopped.db"
    run_inprocess(tiny_config(*sets), str(ref_db))
    stop = []  # asked to stop once version 7 exists: at the next wait for a reply
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*sets), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(p.version) if p.version >= 7 else None)

    def jobs(path) -> set:
        with sqlite3.connect(path) as conn:
            return set(conn.execute("SELECT status, reason FROM jobs WHERE status NOT IN"
                                    " ('done', 'lost')"))

    assert jobs(db) == {("cancelled", "run interrupted")}  # none left running
    run_inprocess(tiny_config(*sets), str(db), resume=1)  # rewind: running again, re-sent
    (ref,), (run,) = store.list_runs(ref_db), store.list_runs(db)
    assert (run["status"], run["final_hash"]) == ("finished", ref["final_hash"])
    assert jobs(db) == jobs(ref_db) == {("cancelled", "run finished")}


def test_real_time_leaves_out_the_time_a_resumed_run_was_away(tmp_path, monkeypatch):
    """After a resume "real time" counted from the run's creation: the hours a killed run
    lay still were its run time. The resume logs how long it was away; readers leave
    that out, and its evaluations' wall times go on from the checkpoint's."""
    import types

    from fedlm.engine import Interrupted
    from fedlm.store import writer as writer_lib

    sets = [*BASE, "reliability.checkpoint_every=2"]
    db, stop = tmp_path / "r.db", []
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*sets), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(p.version) if p.version >= 4 else None)
    with sqlite3.connect(db) as conn:
        walls = [w for (w,) in conn.execute("SELECT wall_time FROM metrics ORDER BY id")]
    # the store's clock 1,000 s on: as if the run were resumed 1,000 s after it stopped
    later = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time)
                                     if not k.startswith("_")})
    later.time = lambda: time.time() + 1000
    monkeypatch.setattr(writer_lib, "time", later)
    run_inprocess(tiny_config(*sets), str(db), resume=1)
    with sqlite3.connect(db) as conn:
        (detail,) = conn.execute("SELECT detail FROM events WHERE kind='away'").fetchone()
        created, finished = conn.execute("SELECT created_at, finished_at FROM runs").fetchone()
        after = [w for (w,) in conn.execute("SELECT wall_time FROM metrics ORDER BY id")]
    away = float(detail.split()[0])
    assert 1000 <= away < 1000 + 60
    summary = store.summarize(db, 1)
    assert summary.wall_time == pytest.approx(finished - created - away)
    assert 0 < summary.wall_time < 120  # the run's own seconds, not the 1,000 away
    # its evaluations' wall times go on from the checkpoint's: no jump back to 0
    assert after == sorted(after) and after[:len(walls)][:3] == walls[:3]


def test_a_second_resume_keeps_the_first_ones_time_away(tmp_path):
    # stopped again before a new checkpoint: the second resume cuts the store back to the
    # same checkpoint, and with it went the first resume's record of its time away
    from fedlm.engine import Interrupted

    sets = [*BASE, "reliability.checkpoint_every=4"]
    db = tmp_path / "r.db"
    for resume, at in ((None, 4), (1, 5)):
        stop = []
        with pytest.raises(Interrupted):
            run_inprocess(tiny_config(*sets), str(db), resume=resume,
                          should_stop=lambda: bool(stop),
                          progress=lambda p: stop.append(1) if p.version >= at else None)
    run_inprocess(tiny_config(*sets), str(db), resume=1)
    with sqlite3.connect(db) as conn:
        kinds = [k for (k,) in conn.execute("SELECT kind FROM events WHERE kind IN "
                                            "('away', 'resumed') ORDER BY id")]
    assert kinds.count("away") == 2


def test_resume_refuses_a_finished_run_and_a_config(tmp_path):
    db = tmp_path / "r.db"
    run_inprocess(tiny_config("updates=1"), str(db))
    for args in (["--resume", "1"], ["--resume", "1", "--set", "updates=3"], ["--resume", "9"]):
        out = subprocess.run(_fedlm("run", *args, "--db", str(db)), capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_checkpoint_files_are_verified(tmp_path):
    folder = tmp_path / "ck"
    me = checkpoint.identity("store", tmp_path / "x.db", 1, 1.0)
    checkpoint.save(folder, 2, {"x": 1, "run": me}, keep=3)
    checkpoint.save(folder, 4, {"x": 2, "run": me}, keep=3)
    assert checkpoint.latest(folder, me)[0] == {"x": 2, "run": me}
    newest = folder / "ckpt-v000000004.pt"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit
    newest.write_bytes(bytes(data))
    payload, path, skipped = checkpoint.latest(folder, me)
    assert payload == {"x": 1, "run": me} and "checksum" in skipped[0]
    for k in (6, 8, 10):
        checkpoint.save(folder, k, {"x": k, "run": me}, keep=3)
    assert [p.name for p in sorted(folder.glob("ckpt-v*.pt"))] == [
        "ckpt-v000000006.pt", "ckpt-v000000008.pt", "ckpt-v000000010.pt"]


def test_init_from_a_checkpoint_file_starts_from_its_global_weights(tmp_path):
    """``init.from = PATH`` reads a run's checkpoint: the global params in the engine's
    state, under ``model`` (``driver`` in checkpoints written before that was renamed)."""
    from fedlm.engine import Interrupted
    from fedlm.params import params_hash

    db = tmp_path / "r.db"
    stop = []  # stopped once version 2 exists: its checkpoint is written, then the run ends
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config("updates=4", "reliability.checkpoint_every=2"), str(db),
                      should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(p.version) if p.version >= 2 else None)
    (ckpt,) = checkpoint.folder_for(db, 1).glob("ckpt-v*.pt")
    payload = checkpoint.read(ckpt)
    weights = payload["engine"]["model"]["params"]
    engine = dict(payload["engine"])
    engine["driver"] = engine.pop("model")
    old = checkpoint.write(tmp_path / "old.pt", {**payload, "engine": engine})
    for path in (ckpt, old):
        run = run_inprocess(tiny_config("updates=1", f"init.from={path}"), str(db))
        with sqlite3.connect(db) as conn:
            start_hash, = conn.execute("SELECT start_hash FROM runs WHERE id=?",
                                       (run,)).fetchone()
        assert start_hash == params_hash(weights) != params_hash(start_lib.initial(
            tiny_config()))


def _stopped_at(db, version: int, *sets: str) -> None:
    """Run ``sets`` into ``db`` and stop it (interrupted) once ``version`` exists."""
    from fedlm.engine import Interrupted

    stop = []
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*sets), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(p.version) if p.version >= version else None)


def test_a_moved_store_resumes_from_its_moved_checkpoints(tmp_path):
    """The checkpoint folder's name holds a digest of the store's path: a store moved
    (and renamed) with its checkpoints/ folder still resumes from its checkpoint."""
    sets = ["updates=6", "reliability.checkpoint_every=2", "strategy=async-sgd"]
    ref_db, here, there = tmp_path / "ref.db", tmp_path / "a", tmp_path / "b"
    run_inprocess(tiny_config(*sets), str(ref_db))
    here.mkdir()
    _stopped_at(here / "x.db", 4, *sets)
    assert any(checkpoint.folder_for(here / "x.db", 1).glob("ckpt-v*.pt"))
    here.rename(there)
    moved = there / "y.db"
    (there / "x.db").rename(moved)
    run_inprocess(tiny_config(*sets), str(moved), resume=1)
    (ref,), (run,) = store.list_runs(ref_db), store.list_runs(moved)
    assert (run["status"], run["final_hash"]) == ("finished", ref["final_hash"])
    with sqlite3.connect(moved) as conn:
        (detail,), = conn.execute("SELECT detail FROM events WHERE kind='resumed'")
    assert detail.startswith("from ckpt-v"), detail  # not "from the start"
    assert not (there / "checkpoints").exists() or not any((there / "checkpoints").iterdir())


def test_a_resume_without_a_checkpoint_says_so(tmp_path):
    import shutil

    db = tmp_path / "x.db"
    _stopped_at(db, 2, "updates=3", "reliability.checkpoint_every=2")
    shutil.rmtree(tmp_path / "checkpoints")
    out = subprocess.run(_fedlm("run", "--resume", "1", "--backend", "inprocess", "--quiet",
                                "--db", str(db)), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (f"fedlm: no checkpoint of run 1 next to {db}; starting over from version 0\n"
            in out.stderr), out.stderr
