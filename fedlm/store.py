"""The run store: SQLite in WAL mode, one file for many runs.

Any number of runs write one file at once (``fedlm sweep --jobs N``, several
``fedlm run``), and any number of readers (CLI, dashboard, replay) read it
while they do. A writer buffers its rows in memory and writes them in short
``BEGIN IMMEDIATE`` transactions (about every ``RunWriter.FLUSH_EVERY``
seconds, at evaluations and at the end), retried with back-off while another
writer holds the lock: no transaction stays open across training, evaluation
or a checkpoint, so writers interleave instead of taking turns. WAL lets
readers go on while a writer commits; readers open the file read-only.

Each run records the process that writes it (``fedlm.ownership``): readers
show a ``running`` run whose writer is gone as ``crashed``. Tables:

    meta       schema version, and the store's id (checkpoints name it)
    runs       one row per run: config, seed, status, final numbers, its writer
    workers    each worker's profile (speed, jitter, region link)
    intervals  every download / compute / upload / idle span, virtual time
    jobs       every dispatched job: worker, base version, local steps, data
               seed, and its place (op) in the operation log
    updates    every finished job in the order the engine handed it to the
               strategy, with its base version, staleness and a hash of it.
               jobs + updates (+ lost jobs) ordered by op are the operation
               log: enough to replay the run exactly (fedlm.replay)
    metrics    validation evaluations of the global model
    events     anything else worth seeing (rejected updates, lost messages)
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
import uuid
from contextlib import closing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from fedlm import ownership

SCHEMA_VERSION = 5
# Older schemas this version upgrades in place, a version at a time:
# version -> the statements that make it the next one.
_MIGRATIONS = {
    2: ["ALTER TABLE jobs ADD COLUMN prev_job INTEGER",
        "ALTER TABLE jobs ADD COLUMN fault TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN reason TEXT",
        "ALTER TABLE jobs ADD COLUMN down_bytes INTEGER",
        "ALTER TABLE jobs ADD COLUMN up_bytes INTEGER"],
    3: ["ALTER TABLE runs ADD COLUMN owner_host TEXT",
        "ALTER TABLE runs ADD COLUMN owner_pid INTEGER",
        "ALTER TABLE runs ADD COLUMN owner_started REAL",
        "ALTER TABLE runs ADD COLUMN heartbeat_at REAL"],
    4: ["ALTER TABLE runs ADD COLUMN start_hash TEXT",
        "ALTER TABLE jobs ADD COLUMN shard INTEGER",
        "ALTER TABLE jobs ADD COLUMN cursor INTEGER",
        "ALTER TABLE jobs ADD COLUMN schedule_step INTEGER"],
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL, status TEXT NOT NULL,
    strategy TEXT NOT NULL, local_steps TEXT NOT NULL, profile TEXT NOT NULL,
    model TEXT NOT NULL, workers INTEGER NOT NULL, seed INTEGER NOT NULL,
    mode TEXT NOT NULL,                 -- virtual (simulation) | wall (arrival order)
    config_json TEXT NOT NULL, strategy_summary TEXT NOT NULL DEFAULT '',
    num_parameters INTEGER, initial_hash TEXT,
    created_at REAL NOT NULL, finished_at REAL,
    virtual_time REAL, updates INTEGER, final_hash TEXT, error TEXT,
    owner_host TEXT, owner_pid INTEGER,  -- the process writing it (fedlm.ownership)
    owner_started REAL, heartbeat_at REAL,
    start_hash TEXT                     -- weights the federated phase started from (fedlm.start)
);
CREATE TABLE IF NOT EXISTS workers (
    run_id INTEGER NOT NULL, worker INTEGER NOT NULL, node_id TEXT,
    step_time REAL NOT NULL, jitter REAL NOT NULL, region TEXT NOT NULL,
    latency REAL NOT NULL, down_bw REAL NOT NULL, up_bw REAL NOT NULL,
    shard_sequences INTEGER NOT NULL,
    PRIMARY KEY (run_id, worker)
);
CREATE TABLE IF NOT EXISTS intervals (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL, worker INTEGER NOT NULL, kind TEXT NOT NULL,
    t_start REAL NOT NULL, t_end REAL NOT NULL, version INTEGER, job_id INTEGER
);
CREATE INDEX IF NOT EXISTS intervals_run ON intervals (run_id, t_end);
CREATE TABLE IF NOT EXISTS jobs (
    run_id INTEGER NOT NULL, job_id INTEGER NOT NULL, worker INTEGER NOT NULL,
    base_version INTEGER NOT NULL, local_steps INTEGER NOT NULL, data_seed INTEGER NOT NULL,
    dispatch_op INTEGER NOT NULL,       -- position in the operation log
    t_dispatch REAL NOT NULL,
    status TEXT NOT NULL,               -- running | done | lost
    end_op INTEGER,                     -- op of its update, or of its loss
    computed INTEGER,                   -- schema 2 only: lost but computed (rejected)
    prev_job INTEGER,                   -- the worker state it started from (-1: fresh)
    fault TEXT NOT NULL DEFAULT '',     -- injected fault (fedlm.faults), '' = none
    reason TEXT,                        -- lost: error | rejected | deadline | retired
    down_bytes INTEGER,                 -- bytes sent to the worker (the model)
    up_bytes INTEGER,                   -- bytes of its update on the wire (encoded)
    shard INTEGER,                      -- the data shard it trained (fedlm.shards)
    cursor INTEGER,                     -- inner steps handed out from that shard before it
    schedule_step INTEGER,              -- its inner-schedule start (-1: the worker's own)
    PRIMARY KEY (run_id, job_id)
);
CREATE TABLE IF NOT EXISTS updates (
    run_id INTEGER NOT NULL, seq INTEGER NOT NULL, op INTEGER NOT NULL, job_id INTEGER NOT NULL,
    worker INTEGER NOT NULL, base_version INTEGER NOT NULL,
    received_version INTEGER NOT NULL,  -- global version when the strategy took it
    applied_version INTEGER,            -- first version that includes it (NULL: held)
    staleness INTEGER NOT NULL, local_steps INTEGER NOT NULL, data_seed INTEGER NOT NULL,
    tokens INTEGER NOT NULL, train_loss REAL NOT NULL,
    t_dispatch REAL NOT NULL, t_done REAL NOT NULL,
    wall_arrival REAL NOT NULL, compute_seconds REAL NOT NULL,
    update_hash TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS metrics (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL, version INTEGER NOT NULL, virtual_time REAL NOT NULL,
    wall_time REAL NOT NULL, tokens INTEGER NOT NULL, jobs INTEGER NOT NULL,
    loss REAL NOT NULL, perplexity REAL NOT NULL, bits_per_byte REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_run ON metrics (run_id, version);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL, virtual_time REAL NOT NULL, wall_time REAL NOT NULL,
    kind TEXT NOT NULL, worker INTEGER, job_id INTEGER, detail TEXT NOT NULL
);
"""


class StoreError(RuntimeError):
    """The run database cannot be used (the message says why)."""


class IntervalKind(str, Enum):
    DOWNLOAD = "download"
    COMPUTE = "compute"
    UPLOAD = "upload"
    IDLE = "idle"
    OFFLINE = "offline"
    LINK_WAIT = "link wait"  # a transfer waiting for its share of the server's link


T = TypeVar("T")

# One attempt waits at most this long for the write lock (SQLite's own busy
# handler); ``with_retries`` backs off and tries again until ``db_timeout()``.
_ATTEMPT_WAIT = 1.0


def _is_busy(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def with_retries(action: Callable[[], T]) -> T:
    """``action()``, a short write, tried again with jittered exponential back-off
    while another connection holds the database locked, for ``db_timeout()``
    seconds in all; then the last error is raised."""
    deadline = time.monotonic() + db_timeout()
    delay = 0.01
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            left = deadline - time.monotonic()
            if not _is_busy(exc) or left <= 0:
                raise
        time.sleep(min(left, delay * random.uniform(0.5, 1.5)))
        delay = min(delay * 2, 1.0)


def transaction(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """``work(conn)`` inside one ``BEGIN IMMEDIATE`` transaction (the write lock is
    taken first, so it cannot fail half-way for want of it), with retries."""
    def attempt() -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = work(conn)
            conn.execute("COMMIT")
            return result
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return with_retries(attempt)


def _writer_connection(path: Path) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; every write goes through
    # ``transaction`` (or is a single autocommitted statement).
    return sqlite3.connect(path, timeout=min(db_timeout(), _ATTEMPT_WAIT), isolation_level=None,
                           check_same_thread=False)


def connect(path: str | Path) -> sqlite3.Connection:
    """A writer connection; creates the file and schema, or migrates an older
    schema, if needed. Many processes may do this at once."""
    path = Path(path)
    for folder in path.parents:  # the nearest that exists must be a folder
        if folder.exists():
            if not folder.is_dir():
                raise StoreError(f"db: cannot create {_where(path)}: {_where(folder)} is a "
                                 f"file, not a folder")
            break
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = _writer_connection(path)
    try:
        with_retries(lambda: conn.execute("PRAGMA journal_mode=WAL"))
        conn.execute("PRAGMA synchronous=NORMAL")
        transaction(conn, lambda c: _create_or_migrate(c, path))
    except BaseException:
        conn.close()
        raise
    return conn


def _create_or_migrate(conn: sqlite3.Connection, path: Path) -> None:
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone()
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() \
        if has_meta else None
    if row is not None:
        version = int(row[0]) if str(row[0]).isdigit() else row[0]
        while version in _MIGRATIONS:
            for statement in _MIGRATIONS[version]:
                conn.execute(statement)
            version += 1
        if version != SCHEMA_VERSION:
            raise StoreError(f"db: {_where(path)} holds schema version {row[0]}, this fedlm "
                             f"writes version {SCHEMA_VERSION}; use another --db")
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version),))
    else:
        for statement in _SCHEMA.split(";\n"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                     (str(SCHEMA_VERSION),))
    conn.execute("INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (uuid.uuid4().hex,))


def store_id(conn: sqlite3.Connection) -> str:
    """The store's own random id, made with it: a checkpoint names the store it
    belongs to, so a store deleted and made again under the same path (whose run
    ids start over at 1) never takes a checkpoint of the old one for its own."""
    return conn.execute("SELECT value FROM meta WHERE key='store_id'").fetchone()[0]


def connect_readonly(path: str | Path) -> sqlite3.Connection:
    """A reader that never blocks (nor is blocked by) the writer.

    Refuses with a one-line ``StoreError`` a file that is not a fedlm run database
    or holds another schema version; an older version that ``connect`` migrates is
    upgraded in place first (the only write a reader makes)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no run database at {path}")
    if p.is_dir():
        raise StoreError(f"db: {_where(path)} is a directory, not a run database")
    for attempt in (1, 2):
        conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True,
                               timeout=db_timeout(), check_same_thread=False)
        conn.row_factory = sqlite3.Row
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.Error as exc:
            conn.close()
            raise db_error(path, exc) from None
        version = row[0] if row else None
        if version == str(SCHEMA_VERSION):
            return conn
        conn.close()
        if version is None:
            raise StoreError(f"db: {_where(path)} is not a fedlm run database (no schema version)")
        if attempt == 1 and str(version).isdigit() and int(version) in _MIGRATIONS:
            try:
                connect(p).close()  # the writer's migration, then read
            except (sqlite3.Error, OSError) as exc:
                raise StoreError(f"db: {_where(path)} holds schema version {version} and cannot "
                                 f"be upgraded to {SCHEMA_VERSION}: {db_error(path, exc)}") from None
            continue
        break
    raise StoreError(f"db: {_where(path)} holds schema version {version}, this fedlm reads "
                     f"version {SCHEMA_VERSION} (another fedlm wrote it); use that fedlm or "
                     f"another --db")


def db_timeout() -> float:
    """Seconds to wait on a database another connection holds locked before giving
    up: ``FEDLM_DB_TIMEOUT``, default 30."""
    try:
        seconds = float(os.environ.get("FEDLM_DB_TIMEOUT", "30"))
    except ValueError:
        return 30.0
    return seconds if 0 <= seconds <= 86400 else 30.0


def _where(path: str | Path) -> str:
    text = str(path)
    return text if text.isprintable() else repr(text)


def db_error(path: str | Path, exc: BaseException) -> StoreError:
    """A one-line ``StoreError`` for an sqlite3 (or OS) error on the run database ``path``."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    where = _where(path)
    if isinstance(exc, StoreError):
        return exc
    if "file is not a database" in text:
        return StoreError(f"db: {where} is not a SQLite database")
    if "locked" in text or "busy" in text:
        return StoreError(f"db: {where} is locked by another process (gave up after "
                          f"{db_timeout():g} s; FEDLM_DB_TIMEOUT sets the wait)")
    if "no such table" in text or "no such column" in text:
        return StoreError(f"db: {where} is not a fedlm run database ({text})")
    if "malformed" in text:
        return StoreError(f"db: {where} is damaged ({text})")
    if "unable to open" in text:
        return StoreError(f"db: cannot open {where} ({text})")
    if isinstance(exc, OSError) and exc.strerror:
        return StoreError(f"db: cannot use {where}: {exc.strerror}")
    return StoreError(f"db: {where}: {text}")


class RunWriter:
    """Everything the engine writes about one run.

    Rows are buffered and written together in one short transaction at most
    every ``FLUSH_EVERY`` seconds (``commit(force=False)``), at evaluations and
    at the end (``commit()``), so a live reader sees the run advance without a
    transaction per job slowing big runs down, and no lock is held while the
    run trains. The writer owns its run (``fedlm.ownership``): a heartbeat
    thread marks it alive until ``finish`` or ``close``."""

    FLUSH_EVERY = 0.25

    def __init__(self, path: str | Path, *, name: str, strategy: str, local_steps: str,
                 profile: str, model: str, workers: int, seed: int, mode: str,
                 config_json: str, strategy_summary: str = "") -> None:
        self._open(path)
        me = self.owner
        now = time.time()

        def insert(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT INTO runs (name, status, strategy, local_steps, profile, model, workers,"
                " seed, mode, config_json, strategy_summary, created_at, owner_host, owner_pid,"
                " owner_started, heartbeat_at)"
                " VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (name, strategy, local_steps, profile, model, workers, seed, mode, config_json,
                 strategy_summary, now, me.host, me.pid, me.started, now))
            return int(cur.lastrowid)

        try:
            self.run_id = transaction(self.conn, insert)
        except BaseException:
            self.conn.close()
            raise
        self.created_at = now
        self._start_heartbeat()

    def _open(self, path: str | Path) -> None:
        self.path = Path(path)
        self.conn = connect(self.path)
        self.store_id = store_id(self.conn)
        self.owner = ownership.current()
        self._pending: list[tuple[str, Any, bool]] = []  # (sql, parameters, executemany)
        self._last_flush = time.monotonic()
        self._heartbeat: ownership.Heartbeat | None = None

    @classmethod
    def reopen(cls, path: str | Path, run_id: int) -> "RunWriter":
        """A writer for an existing run (``fedlm run --resume``): takes the run over
        from its previous writer, which must be gone (``StoreError`` if it is alive
        or the run has finished)."""
        self = cls.__new__(cls)
        self._open(path)
        me = self.owner

        def take_over(conn: sqlite3.Connection) -> float:
            row = conn.execute("SELECT status, owner_host, owner_pid, owner_started,"
                               " heartbeat_at, created_at FROM runs WHERE id=?",
                               (run_id,)).fetchone()
            if row is None:
                raise StoreError(f"--resume: no run {run_id} in {path}")
            status, host, pid, started, heartbeat_at, created_at = row
            if status == "finished":
                raise StoreError(f"--resume: run {run_id} in {path} has already finished")
            if status == "running":
                alive = ownership.judge(host, pid, started, heartbeat_at)
                if alive.alive:
                    raise StoreError(f"--resume: run {run_id} in {path} is still running "
                                     f"({alive.why}); two writers would break its log")
            conn.execute("UPDATE runs SET owner_host=?, owner_pid=?, owner_started=?,"
                         " heartbeat_at=? WHERE id=?",
                         (me.host, me.pid, me.started, time.time(), run_id))
            return created_at

        try:
            self.created_at = transaction(self.conn, take_over)
        except BaseException:
            self.conn.close()
            raise
        self.run_id = run_id
        self._start_heartbeat()
        return self

    def _start_heartbeat(self) -> None:
        run_id, me = self.run_id, self.owner
        conn = _writer_connection(self.path)  # its own: the heartbeat runs on its own thread

        def beat() -> None:
            conn.execute("UPDATE runs SET heartbeat_at=? WHERE id=? AND owner_pid=? AND"
                         " owner_host=?", (time.time(), run_id, me.pid, me.host))

        self._heartbeat_conn = conn
        self._heartbeat = ownership.Heartbeat(beat)

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat_conn.close()
            self._heartbeat = None

    # -- buffered writes ------------------------------------------------------
    def _queue(self, sql: str, parameters: Any, many: bool = False) -> None:
        self._pending.append((sql, parameters, many))

    def _flush(self) -> None:
        """Write every buffered row in one transaction. On failure the rows stay
        buffered, so a later flush can try again."""
        if not self._pending:
            return
        pending, me = self._pending, self.owner

        def write(conn: sqlite3.Connection) -> None:
            # fenced: a writer taken for dead and taken over (--resume) writes no more
            owner = conn.execute("SELECT owner_host, owner_pid FROM runs WHERE id=?",
                                 (self.run_id,)).fetchone()
            if owner != (me.host, me.pid):
                raise StoreError(f"db: run {self.run_id} was taken over by pid {owner[1]} on "
                                 f"{owner[0]} (fedlm run --resume); this writer stops")
            for sql, parameters, many in pending:
                (conn.executemany if many else conn.execute)(sql, parameters)

        transaction(self.conn, write)
        self._pending = []
        self._last_flush = time.monotonic()

    def commit(self, force: bool = True) -> None:
        """Write the buffered rows now (``force``), or only if the last write is
        older than FLUSH_EVERY."""
        if force or time.monotonic() - self._last_flush >= self.FLUSH_EVERY:
            self._flush()

    def positions(self) -> dict[str, int]:
        """How far each log table has got (written rows); a checkpoint stores it."""
        self._flush()
        q = "SELECT COALESCE(MAX(id), 0) FROM {} WHERE run_id=?"
        return {t: int(self.conn.execute(q.format(t), (self.run_id,)).fetchone()[0])
                for t in ("intervals", "metrics", "events")}

    def rewind(self, positions: dict[str, int], *, next_job_id: int, seq: int,
               version: int, in_flight: list[int]) -> None:
        """Forget what the run logged after a checkpoint: rows past ``positions``,
        jobs from ``next_job_id``, updates from ``seq``; the checkpoint's jobs in
        flight are running again and its held updates not yet applied."""
        r = self.run_id
        self._flush()

        def cut(conn: sqlite3.Connection) -> None:
            for table, last in positions.items():
                conn.execute(f"DELETE FROM {table} WHERE run_id=? AND id>?", (r, last))
            conn.execute("DELETE FROM jobs WHERE run_id=? AND job_id>=?", (r, next_job_id))
            conn.execute("DELETE FROM updates WHERE run_id=? AND seq>=?", (r, seq))
            conn.executemany("UPDATE jobs SET status='running', end_op=NULL, computed=NULL,"
                             " reason=NULL WHERE run_id=? AND job_id=?",
                             [(r, j) for j in in_flight])
            conn.execute("UPDATE updates SET applied_version=NULL WHERE run_id=?"
                         " AND applied_version>?", (r, version))
            conn.execute("UPDATE runs SET status='running', finished_at=NULL, error=NULL,"
                         " final_hash=NULL WHERE id=?", (r,))

        transaction(self.conn, cut)

    def set_model_info(self, num_parameters: int, initial_hash: str,
                       start_hash: str | None = None) -> None:
        """The model's size, the hash of its seeded initialisation and of the weights
        the federated phase starts from (they differ after ``init.*``)."""
        self._queue("UPDATE runs SET num_parameters=?, initial_hash=?, start_hash=? WHERE id=?",
                    (num_parameters, initial_hash, start_hash or initial_hash, self.run_id))
        self._flush()

    def add_workers(self, rows: Iterable[dict[str, Any]]) -> None:
        self._queue(
            "INSERT OR REPLACE INTO workers VALUES (:run_id, :worker, :node_id, :step_time, :jitter,"
            " :region, :latency, :down_bw, :up_bw, :shard_sequences)",
            [{"run_id": self.run_id, **r} for r in rows], many=True)
        self._flush()

    def add_intervals(self, rows: Iterable[tuple[int, IntervalKind, float, float, int, int]]) -> None:
        """Rows of (worker, kind, t_start, t_end, version, job_id); empty spans skipped."""
        self._queue(
            "INSERT INTO intervals (run_id, worker, kind, t_start, t_end, version, job_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(self.run_id, w, IntervalKind(k).value, a, b, v, j)
             for w, k, a, b, v, j in rows if b > a], many=True)

    def add_update(self, row: dict[str, Any]) -> None:
        self._queue(
            "INSERT INTO updates VALUES (:run_id, :seq, :op, :job_id, :worker, :base_version,"
            " :received_version, NULL, :staleness, :local_steps, :data_seed, :tokens,"
            " :train_loss, :t_dispatch, :t_done, :wall_arrival, :compute_seconds, :update_hash)",
            {"run_id": self.run_id, **row})

    def add_job(self, job, *, op: int, t_dispatch: float, down_bytes: int | None = None,
                up_bytes: int | None = None) -> None:
        self._queue(
            "INSERT INTO jobs (run_id, job_id, worker, base_version, local_steps, data_seed,"
            " dispatch_op, t_dispatch, status, prev_job, fault, down_bytes, up_bytes, shard,"
            " cursor, schedule_step) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?,"
            " ?, ?)",
            (self.run_id, job.job_id, job.worker, job.base_version, job.local_steps,
             job.data_seed, op, t_dispatch, job.prev_job, job.fault, down_bytes, up_bytes,
             job.shard, job.cursor, job.schedule_step))

    def end_job(self, job_id: int, *, status: str, op: int, computed: bool = True,
                reason: str | None = None) -> None:
        self._queue("UPDATE jobs SET status=?, end_op=?, computed=?, reason=?"
                    " WHERE run_id=? AND job_id=?",
                    (status, op, int(computed), reason, self.run_id, job_id))

    def mark_applied(self, version: int, seqs: list[int]) -> None:
        """The updates ``seqs`` (held until now) are part of global ``version``."""
        self._queue("UPDATE updates SET applied_version=? WHERE run_id=? AND seq=?",
                    [(version, self.run_id, q) for q in seqs], many=True)

    def add_metric(self, *, version: int, virtual_time: float, wall_time: float, tokens: int,
                   jobs: int, loss: float, perplexity: float, bits_per_byte: float) -> None:
        self._queue(
            "INSERT INTO metrics (run_id, version, virtual_time, wall_time, tokens, jobs, loss,"
            " perplexity, bits_per_byte) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.run_id, version, virtual_time, wall_time, tokens, jobs, loss, perplexity,
             bits_per_byte))

    def add_event(self, *, kind: str, virtual_time: float, worker: int | None = None,
                  job_id: int | None = None, detail: str = "") -> None:
        self._queue(
            "INSERT INTO events (run_id, virtual_time, wall_time, kind, worker, job_id, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.run_id, virtual_time, time.time(), kind, worker, job_id, detail))

    # -- the end ----------------------------------------------------------------
    def finish(self, *, status: str, virtual_time: float, updates: int,
               final_hash: str | None, error: str | None = None) -> None:
        """Record how the run ended, with every buffered row. A run that did not
        finish is recorded even when its rows cannot be (the store stuck, the
        disk full): then through a fresh connection, with the rows dropped."""
        self._queue("UPDATE runs SET status=?, finished_at=?, virtual_time=?, updates=?,"
                    " final_hash=?, error=? WHERE id=?",
                    (status, time.time(), virtual_time, updates, final_hash, error, self.run_id))
        try:
            self._flush()
        except (sqlite3.Error, OSError) as exc:
            if status == "finished":
                raise
            self._pending = []
            mark_ended(self.path, self.run_id, status=status, virtual_time=virtual_time,
                       updates=updates, error=f"{error} (and its last rows were not written: "
                                                f"{db_error(self.path, exc)})")
        self._stop_heartbeat()

    def close(self) -> None:
        self._stop_heartbeat()
        self.conn.close()


def mark_ended(path: str | Path, run_id: int, *, status: str, virtual_time: float,
               updates: int, error: str) -> None:
    """Record that run ``run_id`` ended without finishing, through a connection of
    its own (the writer's may be the thing that is stuck), with retries."""
    with closing(_writer_connection(Path(path))) as conn:
        with_retries(lambda: conn.execute(
            "UPDATE runs SET status=?, finished_at=?, virtual_time=?, updates=?, final_hash=NULL,"
            " error=? WHERE id=?", (status, time.time(), virtual_time, updates, error, run_id)))


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerSummary:
    worker: int
    step_time: float
    region: str
    jobs: int
    compute: float
    communication: float  # download + upload + waiting for the shared link
    idle: float
    idle_fraction: float


@dataclass(frozen=True)
class RunSummary:
    run_id: int
    name: str
    status: str
    strategy: str
    profile: str
    model: str
    mode: str  # virtual | wall
    workers: list[WorkerSummary]
    updates: int
    jobs: int
    tokens: int
    local_steps: int
    virtual_time: float
    wall_time: float
    first_perplexity: float | None
    final_perplexity: float | None
    best_perplexity: float | None
    final_hash: str | None

    @property
    def idle_fraction(self) -> float:
        total = sum(w.compute + w.communication + w.idle for w in self.workers)
        return sum(w.idle for w in self.workers) / total if total else 0.0


def shown_status(run: sqlite3.Row | dict) -> str:
    """A run's status as readers show it: ``crashed`` for a ``running`` run whose
    writer is gone (``fedlm.ownership.judge``), else the stored status."""
    if run["status"] != "running":
        return run["status"]
    alive = ownership.judge(run["owner_host"], run["owner_pid"], run["owner_started"],
                            run["heartbeat_at"])
    return "running" if alive.alive else "crashed"


def last_seen(run: sqlite3.Row | dict) -> str:
    """When a crashed run's writer was last heard of, for messages."""
    seen = run["heartbeat_at"] or run["created_at"]
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seen)) if seen else "never"


def list_runs(path: str | Path) -> list[dict[str, Any]]:
    """Every run, oldest first, with ``last_perplexity`` and the status readers show
    (``shown_status``: ``crashed`` where the writer is gone)."""
    with closing(connect_readonly(path)) as conn:
        rows = conn.execute(
            "SELECT r.*, (SELECT perplexity FROM metrics m WHERE m.run_id = r.id"
            " ORDER BY m.id DESC LIMIT 1) AS last_perplexity FROM runs r ORDER BY r.id"
        ).fetchall()
    return [{**dict(r), "status": shown_status(r)} for r in rows]


def summarize(path: str | Path, run_id: int) -> RunSummary:
    with closing(connect_readonly(path)) as conn:
        run = conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if run is None:
            raise KeyError(f"no run {run_id} in {path}")
        metrics = conn.execute("SELECT * FROM metrics WHERE run_id=? ORDER BY id",
                               (run_id,)).fetchall()
        end = run["virtual_time"]
        if end is None:
            end = conn.execute("SELECT COALESCE(MAX(t_end), 0) FROM intervals WHERE run_id=?",
                               (run_id,)).fetchone()[0]
        workers = []
        for w in conn.execute("SELECT * FROM workers WHERE run_id=? ORDER BY worker", (run_id,)):
            spans = dict(conn.execute(
                "SELECT kind, SUM(t_end - t_start) FROM intervals WHERE run_id=? AND worker=?"
                " GROUP BY kind", (run_id, w["worker"])).fetchall())
            jobs = conn.execute("SELECT COUNT(*) FROM updates WHERE run_id=? AND worker=?",
                                (run_id, w["worker"])).fetchone()[0]
            idle = spans.get("idle", 0.0)
            workers.append(WorkerSummary(
                w["worker"], w["step_time"], w["region"], jobs, spans.get("compute", 0.0),
                spans.get("download", 0.0) + spans.get("upload", 0.0)
                + spans.get("link wait", 0.0), idle,
                idle / end if end else 0.0))
        tokens, jobs, steps = conn.execute(
            "SELECT COALESCE(SUM(tokens), 0), COUNT(*), COALESCE(SUM(local_steps), 0)"
            " FROM updates WHERE run_id=?", (run_id,)).fetchone()
    ppl = [m["perplexity"] for m in metrics]
    return RunSummary(
        run_id, run["name"], shown_status(run), run["strategy"], run["profile"], run["model"],
        run["mode"], workers, run["updates"] or (metrics[-1]["version"] if metrics else 0), jobs, tokens,
        steps, end, ((run["finished_at"] or time.time()) - run["created_at"]),
        ppl[0] if ppl else None, ppl[-1] if ppl else None, min(ppl) if ppl else None,
        run["final_hash"])


@dataclass(frozen=True)
class Troubles:
    """What went wrong in a run and was handled: for ``fedlm show``."""

    faults: dict[str, int]  # injected faults by kind (faults.*)
    lost: dict[str, int]  # lost jobs by reason: error | rejected | deadline | retired
    retired: list[tuple[int, str]]  # (worker, why), in the order they were retired
    ignored: dict[str, int]  # replies ignored: late_reply | duplicate_reply
    rounds_closed: int  # sync rounds closed at their deadline without every reply
    offline: dict[int, int]  # worker -> offline periods

    def __bool__(self) -> bool:
        return any((self.faults, self.lost, self.retired, self.ignored, self.rounds_closed,
                    self.offline))


def troubles(path: str | Path, run_id: int) -> Troubles:
    """Faults, lost jobs, retired workers and the like of run ``run_id``."""
    with closing(connect_readonly(path)) as conn:
        def counts(sql: str) -> dict:
            return {k: n for k, n in conn.execute(sql, (run_id,)).fetchall()}

        faults = counts("SELECT detail, COUNT(*) FROM events WHERE run_id=? AND"
                        " kind='fault_injected' GROUP BY detail ORDER BY detail")
        lost = counts("SELECT COALESCE(reason, 'unknown'), COUNT(*) FROM jobs WHERE run_id=?"
                      " AND status='lost' GROUP BY 1 ORDER BY 1")
        retired = [(w, d) for w, d in conn.execute(
            "SELECT worker, detail FROM events WHERE run_id=? AND kind='worker_retired'"
            " ORDER BY id", (run_id,))]
        ignored = counts("SELECT kind, COUNT(*) FROM events WHERE run_id=? AND kind IN"
                         " ('late_reply', 'duplicate_reply') GROUP BY kind ORDER BY kind")
        closed = conn.execute("SELECT COUNT(*) FROM events WHERE run_id=? AND"
                              " kind='round_closed'", (run_id,)).fetchone()[0]
        offline = counts("SELECT worker, COUNT(*) FROM events WHERE run_id=? AND"
                         " kind='worker_offline' GROUP BY worker ORDER BY worker")
    return Troubles(faults, lost, retired, ignored, closed, offline)


TABLES = ("runs", "workers", "jobs", "intervals", "updates", "metrics", "events")


def export(path: str | Path, run_id: int, out_dir: str | Path, fmt: str = "csv") -> list[Path]:
    """Write each table's rows of ``run_id`` to ``out_dir`` as CSV or Parquet."""
    import pandas as pd

    if fmt not in ("csv", "parquet"):
        raise ValueError(f"format: must be csv or parquet, got {fmt!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with closing(connect_readonly(path)) as conn:
        if conn.execute("SELECT 1 FROM runs WHERE id=?", (run_id,)).fetchone() is None:
            raise KeyError(f"no run {run_id} in {path}")
        for table in TABLES:
            key = "id" if table == "runs" else "run_id"
            frame = pd.read_sql_query(f"SELECT * FROM {table} WHERE {key}=?", conn,
                                      params=(run_id,))
            target = out / f"run{run_id}_{table}.{fmt}"
            if fmt == "csv":
                frame.to_csv(target, index=False)
            else:
                frame.to_parquet(target, index=False)
            written.append(target)
    return written


def config_of(path: str | Path, run_id: int) -> dict[str, Any]:
    with closing(connect_readonly(path)) as conn:
        row = conn.execute("SELECT config_json FROM runs WHERE id=?", (run_id,)).fetchone()
    if row is None:
        raise KeyError(f"no run {run_id} in {path}")
    return json.loads(row[0])
