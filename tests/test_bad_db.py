"""Bad run databases: every command that reads or writes one refuses it in one line
(exit status 2), without creating files for a read, without hanging on a lock.

Cases: a missing file, a database another schema version wrote (1 and 99: never
this one, nor one this version migrates), a file that is not SQLite, an empty file,
a SQLite file of something else, a directory, a FIFO or a device (as the database or
as its write-ahead log: SQLite's open of either would block), a locked database, an
unknown run.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from contextlib import closing

import pytest

from fedlm import config_load, store
from tests._cli import assert_refused, no_work_fixture, run_cli  # noqa: F401 (a fixture)

FOREIGN_VERSIONS = [v for v in (1, 99) if v != store.SCHEMA_VERSION
                    and v not in store.schema.MIGRATIONS]


def make_db(path) -> None:
    """A good run database holding one finished run (id 1)."""
    w = store.RunWriter(path, name="t", strategy="diloco", local_steps="fixed",
                        profile="homogeneous", model="tiny", workers=1, seed=0, clock="virtual",
                        config_json=config_load.load(None, ["model=tiny"]).to_json())
    w.add_metric(version=1, virtual_time=1.0, wall_time=0.1, tokens=64, jobs=1, loss=4.0,
                 perplexity=54.6, bits_per_byte=1.5)
    w.finish(status="finished", virtual_time=1.0, updates=1, final_hash="x")
    w.close()


@pytest.fixture
def good_db(tmp_path):
    path = tmp_path / "good.db"
    make_db(path)
    return path


def bad_db(kind: str, good, tmp) -> tuple[str, str]:
    """(path, the fragment the one-line message must hold) for a bad database ``kind``."""
    path = tmp / f"{kind}.db"
    if kind == "missing":
        return str(path), f"no run database at {path}"
    if kind.startswith("version-"):
        version = kind.split("-")[1]
        shutil.copy(good, path)
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (version,))
        return str(path), (f"holds schema version {version}, this fedlm reads version "
                           f"{store.SCHEMA_VERSION}")
    if kind == "garbage":
        path.write_bytes(random.Random(0).randbytes(8192))
        return str(path), f"db: {path} is not a SQLite database"
    if kind == "empty":
        path.write_bytes(b"")
        return str(path), f"db: {path} is not a fedlm run database"
    if kind == "other-sqlite":
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("CREATE TABLE recipes (name TEXT)")
        return str(path), f"db: {path} is not a fedlm run database"
    if kind == "directory":
        path.mkdir()
        return str(path), f"db: {path} is a directory"
    if kind == "fifo":  # SQLite's own open of it would block for ever, deaf to Ctrl-C
        os.mkfifo(path)
        return str(path), f"db: {path} is a FIFO, not a run database"
    if kind == "device":
        path.symlink_to("/dev/zero")  # named by the link, or where it leads once resolved
        return str(path), "is a character device, not a run database"
    if kind == "wal-fifo":  # a good database whose write-ahead log is a FIFO
        shutil.copy(good, path)
        os.mkfifo(f"{path}-wal")
        return str(path), f"db: {path}-wal is a FIFO, not a run database's wal file"
    raise ValueError(kind)


BAD = ["missing", *[f"version-{v}" for v in FOREIGN_VERSIONS], "version-abc", "garbage", "empty",
       "other-sqlite", "directory", "fifo", "device", "wal-fifo"]
READERS = {
    "runs": ["runs"],
    "show": ["show", "1"],
    "export": ["export", "1", "--out", "{tmp}/export"],
    "replay": ["replay", "1"],
    "resume": ["run", "--resume", "1"],
    "dashboard": ["dashboard"],
}


def _argv(argv, db, tmp) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in argv] + ["--db", db]


@pytest.mark.parametrize("kind", BAD)
@pytest.mark.parametrize("command", sorted(READERS))
def test_readers_refuse_a_bad_db_in_one_line(no_work, good_db, command, kind):
    db, fragment = bad_db(kind, good_db, no_work)
    before = sorted(p.name for p in no_work.iterdir())
    rc, out, err = run_cli(_argv(READERS[command], db, no_work))
    if command == "dashboard" and kind == "missing":
        assert rc == "started"  # the page waits for a run to create it
    else:
        assert_refused(rc, out, err, fragment)
    if kind == "missing":  # a read creates nothing
        assert sorted(p.name for p in no_work.iterdir()) == before


@pytest.mark.parametrize("command", sorted(set(READERS) - {"resume"}))  # its run is finished
def test_readers_accept_the_good_db(no_work, good_db, command):
    rc, out, err = run_cli(_argv(READERS[command], str(good_db), no_work))
    assert (rc, err) == (0 if command in ("runs", "show", "export") else "started", "")


@pytest.mark.parametrize("command", ["show", "export", "replay"])
def test_unknown_run_id(no_work, good_db, command):
    argv = [a if a != "1" else "42" for a in READERS[command]]
    assert_refused(*run_cli(_argv(argv, str(good_db), no_work)), f"no run 42 in {good_db}")


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--resume", "42"], "--resume: no run 42 in"),
    (["run", "--resume", "99999999999999999999999"], "argument --resume: must be a run id"),
    (["run", "--resume", "0"], "argument --resume: must be a run id"),
    (["show", "99999999999999999999999"], "argument run_id: must be a run id"),
    (["export", "-5"], "argument run_id: must be a run id"),
])
def test_run_ids_out_of_range(no_work, good_db, argv, fragment):
    assert_refused(*run_cli(argv + ["--db", str(good_db)]), fragment)


@pytest.mark.parametrize("kind", [k for k in BAD if k not in ("missing", "empty")])
@pytest.mark.parametrize("command", ["run", "deploy"])
def test_writers_refuse_a_bad_db_before_any_work(no_work, good_db, command, kind):
    db, fragment = bad_db(kind, good_db, no_work)
    if kind.startswith("version-"):
        fragment = fragment.replace("this fedlm reads", "this fedlm writes")
    if kind == "other-sqlite":
        fragment = "is a SQLite database of something else"
    argv = ["run"] if command == "run" else ["deploy", "local"]
    assert_refused(*run_cli(argv + ["--set", "model=tiny", "--db", db]), fragment)


@pytest.mark.parametrize("kind", ["missing", "empty", "good"])
def test_writers_take_a_new_or_empty_db(no_work, good_db, kind):
    db = str(good_db) if kind == "good" else bad_db(kind, good_db, no_work)[0]
    assert run_cli(["run", "--set", "model=tiny", "--db", db])[0] == "started"
    assert store.list_runs(db) is not None  # it is a fedlm run database now


def test_dashboard_query_layer_refuses_bad_dbs(no_work, good_db):
    from fedlm.dashboard import queries

    assert len(queries.runs(good_db)) == 1
    for kind in BAD:
        db, fragment = bad_db(kind, good_db, no_work)
        with pytest.raises((store.StoreError, FileNotFoundError)) as info:
            queries.runs(db)
        assert fragment in str(info.value)


# ---------------------------------------------------------------------------
# Locks
# ---------------------------------------------------------------------------

@pytest.fixture
def short_timeout(monkeypatch):
    monkeypatch.setenv("FEDLM_DB_TIMEOUT", "0.3")


def hold_exclusive(path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


def test_a_locked_db_stops_a_run_in_bounded_time(no_work, good_db, short_timeout):
    holder = hold_exclusive(good_db)  # WAL: the writer lock
    try:
        t0 = time.monotonic()
        rc, out, err = run_cli(["run", "--set", "model=tiny", "--db", str(good_db)])
        elapsed = time.monotonic() - t0
        # readers are not blocked by a writer in WAL mode: they go on
        assert run_cli(["runs", "--db", str(good_db)])[0] == 0
    finally:
        holder.close()
    assert_refused(rc, out, err, f"db: {good_db} is locked by another process (gave up after 0.3 s")
    assert elapsed < 10


def test_a_locked_rollback_journal_db_stops_readers_in_bounded_time(no_work, good_db,
                                                                    short_timeout):
    with closing(sqlite3.connect(good_db)) as conn:  # e.g. a copy some tool has converted
        conn.execute("PRAGMA journal_mode=DELETE")
    holder = hold_exclusive(good_db)
    try:
        for argv in (["runs"], ["show", "1"], ["replay", "1"], ["dashboard"]):
            t0 = time.monotonic()
            rc, out, err = run_cli(argv + ["--db", str(good_db)])
            assert_refused(rc, out, err, f"db: {good_db} is locked by another process")
            assert time.monotonic() - t0 < 10
    finally:
        holder.close()
    assert run_cli(["runs", "--db", str(good_db)])[0] == 0  # lock gone: readable again


@pytest.mark.parametrize("value, expected", [("0.3", 0.3), ("0", 0.0), ("", 30.0), ("x", 30.0),
                                             ("-1", 30.0), ("nan", 30.0), ("inf", 30.0)])
def test_db_timeout_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("FEDLM_DB_TIMEOUT", value)
    assert store.db_timeout() == expected


# ---------------------------------------------------------------------------
# What a user sees
# ---------------------------------------------------------------------------

def test_subprocess_foreign_version(tmp_path):
    good = tmp_path / "good.db"
    make_db(good)
    db, fragment = bad_db(f"version-{FOREIGN_VERSIONS[-1]}", good, tmp_path)
    out = subprocess.run([sys.executable, "-m", "fedlm", "show", "1", "--db", db],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out
    assert out.stderr.startswith("fedlm: error: db: ") and out.stderr.count("\n") == 1
    assert fragment in out.stderr and "Traceback" not in out.stderr


def test_readers_upgrade_a_db_this_version_migrates(no_work, good_db):
    """An older schema that ``store.connect`` migrates is upgraded, then read (not refused)."""
    import re

    migrations = store.schema.MIGRATIONS
    if not migrations:
        pytest.skip("no migrations in this schema version")
    old = max(migrations)
    undo = []  # the statements that take the newest migration back
    for s in migrations[old]:
        if m := re.fullmatch(r"ALTER TABLE (\w+) ADD COLUMN (\w+)\b.*", s, re.S):
            undo.append(f"ALTER TABLE {m[1]} DROP COLUMN {m[2]}")
        elif m := re.fullmatch(r"ALTER TABLE (\w+) RENAME COLUMN (\w+) TO (\w+)", s):
            undo.append(f"ALTER TABLE {m[1]} RENAME COLUMN {m[3]} TO {m[2]}")
        elif m := re.match(r"CREATE TABLE IF NOT EXISTS (\w+) ", s):
            undo.append(f"DROP TABLE {m[1]}")
        else:
            pytest.skip(f"cannot undo {s!r} here")
    with closing(sqlite3.connect(good_db)) as conn, conn:  # back to the old schema
        for statement in undo:
            conn.execute(statement)
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(old),))
    rc, out, err = run_cli(["runs", "--db", str(good_db)])
    assert (rc, err) == (0, ""), err
    assert "finished" in out  # the run is listed, read through the upgraded schema
    with closing(sqlite3.connect(good_db)) as conn:
        assert conn.execute("SELECT value FROM meta").fetchone()[0] == str(store.SCHEMA_VERSION)
        columns = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
        assert "clock" in columns and "mode" not in columns


# A full disk while a new store is made, stood in for by RLIMIT_FSIZE (writes past
# the limit fail with EFBIG, SIGXFSZ ignored), lowered once the schema's transaction
# is in the write-ahead log: the fold of the log into the file is what fails.
_FULL_AFTER_LOG = """
import resource, signal, sys
from fedlm.store import connection
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
written = connection.transaction
def then_full(conn, work):
    result = written(conn, work)
    resource.setrlimit(resource.RLIMIT_FSIZE, (36864, resource.RLIM_INFINITY))
    return result
connection.transaction = then_full
try:
    connection.check_writable(sys.argv[1])
except connection.StoreError as exc:
    print(exc)
"""


def test_a_full_disk_while_a_store_is_made_leaves_no_damaged_file(tmp_path):
    db = tmp_path / "new.db"
    out = subprocess.run([sys.executable, "-c", _FULL_AFTER_LOG, str(db)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out
    line = out.stdout.strip()
    assert line.count("\n") == 0 and line.startswith(f"db: cannot create {db}: the disk is full")
    assert "damaged" not in line
    assert list(tmp_path.iterdir()) == []  # neither the half-made file nor its leftovers
    store.check_writable(str(db))  # room again: it is made whole
    assert store.list_runs(str(db)) == []


def _readonly_folder(monkeypatch, folder) -> None:
    """``folder`` reads as not writable (as on a read-only file system), whoever we are."""
    import os

    from fedlm.store import connection
    real = os.access
    def access(p, mode, **kw) -> bool:
        if mode & os.W_OK and os.path.realpath(p) == os.path.realpath(folder):
            return False
        return real(p, mode, **kw)

    monkeypatch.setattr(connection.os, "access", access)


def test_a_store_in_a_folder_that_cannot_be_written_is_read_immutable(no_work, good_db,
                                                                       monkeypatch):
    """A reader of a WAL store makes its -shm file beside it, which it cannot where the
    folder is read-only ("unable to open database file"): it reads the file immutable."""
    assert sorted(p.name for p in good_db.parent.iterdir()) == ["good.db"]
    _readonly_folder(monkeypatch, good_db.parent)
    rc, out, err = run_cli(["runs", "--db", str(good_db)])
    assert (rc, err) == (0, ""), err
    assert "finished" in out
    rc, out, err = run_cli(["show", "1", "--db", str(good_db)])
    assert (rc, err) == (0, ""), err
    # immutable=1 really: nothing was made beside it (mode=ro alone makes good.db-shm)
    assert sorted(p.name for p in good_db.parent.iterdir()) == ["good.db"]


def test_a_store_in_a_read_only_folder_can_be_listed(no_work, good_db):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes into a folder of mode 0555 (the test above covers it)")
    good_db.parent.chmod(0o555)
    try:
        rc, out, err = run_cli(["runs", "--db", str(good_db)])
    finally:
        good_db.parent.chmod(0o755)
    assert (rc, err) == (0, ""), err
    assert "finished" in out


def test_a_store_sqlite_refuses_to_make_is_not_called_a_full_disk(tmp_path, monkeypatch):
    """A schema statement SQLite cannot run (a bug of ours, not the disk): the error says
    SQLite refused it, with SQLite's words, and nothing is left behind."""
    monkeypatch.setattr(store.schema, "SCHEMA", store.schema.SCHEMA + ";\nCREATE TABLE (")
    db = tmp_path / "new.db"
    with pytest.raises(store.StoreError) as err:
        store.check_writable(str(db))
    text = str(err.value)
    assert text.startswith(f"db: cannot create {db}: SQLite refused it (")
    assert "full" not in text and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["device", "file", "fifo inside"])
def test_export_refuses_an_out_that_is_no_folder_of_its_own_before_writing(no_work, good_db,
                                                                           kind):
    """``--out /dev/null`` said "File exists"; a FIFO at one of the export's names would
    have blocked its write for ever."""
    out, fragment = {"device": ("/dev/null", "--out: /dev/null is a character device, not "
                                             "a folder"),
                     "file": (str(good_db), f"--out: {good_db} is a file, not a folder"),
                     "fifo inside": (str(no_work / "out"), "run1_jobs.csv is a FIFO, where "
                                                           "the export writes a file")}[kind]
    if kind == "fifo inside":
        (no_work / "out").mkdir()
        os.mkfifo(no_work / "out" / "run1_jobs.csv")
    assert_refused(*run_cli(["export", "1", "--db", str(good_db), "--out", out]), fragment)
    if kind == "fifo inside":
        assert sorted(p.name for p in (no_work / "out").iterdir()) == ["run1_jobs.csv"]
