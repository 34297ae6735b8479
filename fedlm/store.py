"""The run store: SQLite in WAL mode, one file for many runs.

One writer (the engine) and any number of readers (CLI, dashboard, replay).
WAL lets readers go on while the writer commits; readers open the file
read-only. Tables:

    runs       one row per run: config, seed, status, final numbers
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
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

SCHEMA_VERSION = 3
# Older schemas this version upgrades in place: version -> statements.
_MIGRATIONS = {
    2: ["ALTER TABLE jobs ADD COLUMN prev_job INTEGER",
        "ALTER TABLE jobs ADD COLUMN fault TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN reason TEXT",
        "ALTER TABLE jobs ADD COLUMN down_bytes INTEGER",
        "ALTER TABLE jobs ADD COLUMN up_bytes INTEGER"],
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
    virtual_time REAL, updates INTEGER, final_hash TEXT, error TEXT
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


def connect(path: str | Path) -> sqlite3.Connection:
    """A writer connection; creates the file and schema if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=db_timeout(), check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone()
    if has_meta:
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row and int(row[0]) in _MIGRATIONS:
            with conn:
                for statement in _MIGRATIONS[int(row[0])]:
                    conn.execute(statement)
                conn.execute("UPDATE meta SET value=? WHERE key='schema_version'",
                             (str(SCHEMA_VERSION),))
        elif row and int(row[0]) != SCHEMA_VERSION:
            conn.close()
            raise StoreError(f"db: {path} holds schema version {row[0]}, this fedlm writes "
                             f"version {SCHEMA_VERSION}; use another --db")
    conn.executescript(_SCHEMA)
    conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    conn.commit()
    return conn


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
    """Everything the engine writes about one run. Commits at most every
    ``COMMIT_EVERY`` seconds (and at evaluations and the end), so a live reader
    sees the run advance without a commit per job slowing big runs down."""

    COMMIT_EVERY = 0.25

    def __init__(self, path: str | Path, *, name: str, strategy: str, local_steps: str,
                 profile: str, model: str, workers: int, seed: int, mode: str,
                 config_json: str, strategy_summary: str = "") -> None:
        self.path = Path(path)
        self.conn = connect(self.path)
        cur = self.conn.execute(
            "INSERT INTO runs (name, status, strategy, local_steps, profile, model, workers,"
            " seed, mode, config_json, strategy_summary, created_at)"
            " VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name, strategy, local_steps, profile, model, workers, seed, mode, config_json,
             strategy_summary, time.time()))
        self.run_id = int(cur.lastrowid)
        self.conn.commit()
        self._last_commit = time.monotonic()

    @classmethod
    def reopen(cls, path: str | Path, run_id: int) -> "RunWriter":
        """A writer for an existing run (``fedlm run --resume``)."""
        self = cls.__new__(cls)
        self.path = Path(path)
        self.conn = connect(self.path)
        if self.conn.execute("SELECT 1 FROM runs WHERE id=?", (run_id,)).fetchone() is None:
            self.conn.close()
            raise StoreError(f"db: no run {run_id} in {path}")
        self.run_id = run_id
        self._last_commit = time.monotonic()
        return self

    def positions(self) -> dict[str, int]:
        """How far each log table has got (committed rows); a checkpoint stores it."""
        q = "SELECT COALESCE(MAX(id), 0) FROM {} WHERE run_id=?"
        return {t: int(self.conn.execute(q.format(t), (self.run_id,)).fetchone()[0])
                for t in ("intervals", "metrics", "events")}

    def rewind(self, positions: dict[str, int], *, next_job_id: int, seq: int,
               version: int, in_flight: list[int]) -> None:
        """Forget what the run logged after a checkpoint: rows past ``positions``,
        jobs from ``next_job_id``, updates from ``seq``; the checkpoint's jobs in
        flight are running again and its held updates not yet applied."""
        r = self.run_id
        with self.conn:
            for table, last in positions.items():
                self.conn.execute(f"DELETE FROM {table} WHERE run_id=? AND id>?", (r, last))
            self.conn.execute("DELETE FROM jobs WHERE run_id=? AND job_id>=?", (r, next_job_id))
            self.conn.execute("DELETE FROM updates WHERE run_id=? AND seq>=?", (r, seq))
            self.conn.executemany("UPDATE jobs SET status='running', end_op=NULL, computed=NULL,"
                                  " reason=NULL WHERE run_id=? AND job_id=?",
                                  [(r, j) for j in in_flight])
            self.conn.execute("UPDATE updates SET applied_version=NULL WHERE run_id=?"
                              " AND applied_version>?", (r, version))
            self.conn.execute("UPDATE runs SET status='running', finished_at=NULL, error=NULL,"
                              " final_hash=NULL WHERE id=?", (r,))

    def set_model_info(self, num_parameters: int, initial_hash: str) -> None:
        self.conn.execute("UPDATE runs SET num_parameters=?, initial_hash=? WHERE id=?",
                          (num_parameters, initial_hash, self.run_id))
        self.conn.commit()

    def add_workers(self, rows: Iterable[dict[str, Any]]) -> None:
        self.conn.executemany(
            "INSERT OR REPLACE INTO workers VALUES (:run_id, :worker, :node_id, :step_time, :jitter,"
            " :region, :latency, :down_bw, :up_bw, :shard_sequences)",
            [{"run_id": self.run_id, **r} for r in rows])
        self.conn.commit()

    def add_intervals(self, rows: Iterable[tuple[int, IntervalKind, float, float, int, int]]) -> None:
        """Rows of (worker, kind, t_start, t_end, version, job_id); empty spans skipped."""
        self.conn.executemany(
            "INSERT INTO intervals (run_id, worker, kind, t_start, t_end, version, job_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(self.run_id, w, IntervalKind(k).value, a, b, v, j)
             for w, k, a, b, v, j in rows if b > a])

    def add_update(self, row: dict[str, Any]) -> None:
        self.conn.execute(
            "INSERT INTO updates VALUES (:run_id, :seq, :op, :job_id, :worker, :base_version,"
            " :received_version, NULL, :staleness, :local_steps, :data_seed, :tokens,"
            " :train_loss, :t_dispatch, :t_done, :wall_arrival, :compute_seconds, :update_hash)",
            {"run_id": self.run_id, **row})

    def add_job(self, job, *, op: int, t_dispatch: float, down_bytes: int | None = None,
                up_bytes: int | None = None) -> None:
        self.conn.execute(
            "INSERT INTO jobs (run_id, job_id, worker, base_version, local_steps, data_seed,"
            " dispatch_op, t_dispatch, status, prev_job, fault, down_bytes, up_bytes)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)",
            (self.run_id, job.job_id, job.worker, job.base_version, job.local_steps,
             job.data_seed, op, t_dispatch, job.prev_job, job.fault, down_bytes, up_bytes))

    def end_job(self, job_id: int, *, status: str, op: int, computed: bool = True,
                reason: str | None = None) -> None:
        self.conn.execute("UPDATE jobs SET status=?, end_op=?, computed=?, reason=?"
                          " WHERE run_id=? AND job_id=?",
                          (status, op, int(computed), reason, self.run_id, job_id))

    def mark_applied(self, version: int, seqs: list[int]) -> None:
        """The updates ``seqs`` (held until now) are part of global ``version``."""
        self.conn.executemany("UPDATE updates SET applied_version=? WHERE run_id=? AND seq=?",
                              [(version, self.run_id, q) for q in seqs])

    def add_metric(self, *, version: int, virtual_time: float, wall_time: float, tokens: int,
                   jobs: int, loss: float, perplexity: float, bits_per_byte: float) -> None:
        self.conn.execute(
            "INSERT INTO metrics (run_id, version, virtual_time, wall_time, tokens, jobs, loss,"
            " perplexity, bits_per_byte) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.run_id, version, virtual_time, wall_time, tokens, jobs, loss, perplexity,
             bits_per_byte))

    def add_event(self, *, kind: str, virtual_time: float, worker: int | None = None,
                  job_id: int | None = None, detail: str = "") -> None:
        self.conn.execute(
            "INSERT INTO events (run_id, virtual_time, wall_time, kind, worker, job_id, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.run_id, virtual_time, time.time(), kind, worker, job_id, detail))

    def commit(self, force: bool = True) -> None:
        """Commit now (``force``) or only if the last commit is older than COMMIT_EVERY."""
        if force or time.monotonic() - self._last_commit >= self.COMMIT_EVERY:
            self.conn.commit()
            self._last_commit = time.monotonic()

    def finish(self, *, status: str, virtual_time: float, updates: int,
               final_hash: str | None, error: str | None = None) -> None:
        self.conn.execute(
            "UPDATE runs SET status=?, finished_at=?, virtual_time=?, updates=?, final_hash=?,"
            " error=? WHERE id=?",
            (status, time.time(), virtual_time, updates, final_hash, error, self.run_id))
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


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


def list_runs(path: str | Path) -> list[sqlite3.Row]:
    with closing(connect_readonly(path)) as conn:
        return conn.execute(
            "SELECT r.*, (SELECT perplexity FROM metrics m WHERE m.run_id = r.id"
            " ORDER BY m.id DESC LIMIT 1) AS last_perplexity FROM runs r ORDER BY r.id"
        ).fetchall()


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
        run_id, run["name"], run["status"], run["strategy"], run["profile"], run["model"],
        run["mode"], workers, run["updates"] or (metrics[-1]["version"] if metrics else 0), jobs, tokens,
        steps, end, ((run["finished_at"] or time.time()) - run["created_at"]),
        ppl[0] if ppl else None, ppl[-1] if ppl else None, min(ppl) if ppl else None,
        run["final_hash"])


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
