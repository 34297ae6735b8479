"""The run store's tables, their version, and the upgrades from older versions.

One SQLite file holds many runs. Tables:

    meta       schema version, and the store's id (checkpoints name it)
    runs       one row per run: config, seed, status (running | finished | failed |
               diverged | interrupted), final numbers, its writer
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
    transfers  a two-level strategy's (halos) transfers between its region servers
               and its global server, each with its arrival's op: part of the
               operation log

An older schema is upgraded in place, a version at a time (``MIGRATIONS``),
inside the transaction that opens the file (``fedlm.store.connection.connect``).
"""

from __future__ import annotations

import sqlite3
import uuid
from enum import Enum

SCHEMA_VERSION = 7
# New in schema 7, so both in the schema and in the migration from 6.
TRANSFERS = """CREATE TABLE IF NOT EXISTS transfers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL, op INTEGER NOT NULL,  -- its arrival's place in the operation log
    key INTEGER NOT NULL,               -- the strategy's number for it
    kind TEXT NOT NULL,                 -- push (region -> global server) | model (back)
    region INTEGER NOT NULL, bytes INTEGER NOT NULL,
    t_sent REAL NOT NULL, t_arrived REAL NOT NULL,
    staleness INTEGER NOT NULL,         -- push: global versions since its region merged,
                                        -- model: region versions since the region pushed
    version INTEGER NOT NULL            -- the global version once it arrived
)"""
# Older schemas this version upgrades in place, a version at a time:
# version -> the statements that make it the next one.
MIGRATIONS = {
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
    # the config's name for the order results are applied in (was ``mode``)
    5: ["ALTER TABLE runs RENAME COLUMN mode TO clock"],
    # a two-level strategy's server-to-server transfers (strategy = "halos")
    6: [TRANSFERS],
}

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL, status TEXT NOT NULL,
    strategy TEXT NOT NULL, local_steps TEXT NOT NULL, profile TEXT NOT NULL,
    model TEXT NOT NULL, workers INTEGER NOT NULL, seed INTEGER NOT NULL,
    clock TEXT NOT NULL,                -- virtual (simulation) | wall (arrival order)
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
    status TEXT NOT NULL,               -- running | done | lost | cancelled (the run ended)
    end_op INTEGER,                     -- op of its update, or of its loss
    computed INTEGER,                   -- schema 2 only: lost but computed (rejected)
    prev_job INTEGER,                   -- the worker state it started from (-1: fresh)
    fault TEXT NOT NULL DEFAULT '',     -- injected fault (fedlm.sim.faults), '' = none
    reason TEXT,                        -- lost: error | rejected | deadline | retired,
                                        -- cancelled: run finished | run diverged | ...
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
""" + TRANSFERS + """;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL, virtual_time REAL NOT NULL, wall_time REAL NOT NULL,
    kind TEXT NOT NULL, worker INTEGER, job_id INTEGER, detail TEXT NOT NULL
);
"""

# Every table that holds rows of a run, in the order ``export`` writes them.
TABLES = ("runs", "workers", "jobs", "intervals", "updates", "metrics", "events", "transfers")


# The event a resumed run logs first: its detail starts with the seconds between the last
# sign of life of the process before and the resume, which are no run time (readers
# leave them out of a run's real time).
AWAY_EVENT = "away"
# An operation of the run log: a wake-up a server kind asked for (``ServerKind.wake_in``) rang;
# its detail is JSON: the op, the key, when it was set and when it rang.
TIMER_EVENT = "timer"


class IntervalKind(str, Enum):
    """What a worker did during one span of ``intervals``."""

    DOWNLOAD = "download"
    COMPUTE = "compute"
    UPLOAD = "upload"
    IDLE = "idle"
    OFFLINE = "offline"
    LINK_WAIT = "link wait"  # a transfer waiting for its share of the server's link
    # an all-reduce (network.topology ring/tree) or a streaming round's fragment exchange
    # that the worker waits for ...
    EXCHANGE = "exchange"
    # ... and the part of one that ran behind compute (Streaming DiLoCo's overlap): it
    # overlaps a compute span, so time totals leave it out (COUNTED_KINDS)
    HIDDEN = "hidden exchange"
    # a fleet that changes over time (fedlm.sim.dynamics): the worker is not there
    # (an availability gap, before it joins, after it leaves) ...
    ABSENT = "absent"
    # ... or runs slowed; this overlays its other spans, so time totals leave it out
    SLOWED = "slowed"
    # client sampling (strategies/sampling.py): free and there when a round was drawn, and
    # not drawn; from the draw until that round is over (docs/sampling.md). Not idle:
    # nobody waits for it. Stores written before it have none (such time reads as idle)
    NOT_DRAWN = "not drawn"


# The kinds whose spans never overlap one another: a worker's time adds up over these.
COUNTED_KINDS = tuple(k.value for k in IntervalKind
                      if k not in (IntervalKind.HIDDEN, IntervalKind.SLOWED))
# A worker's time while it is there and taking part: neither absent nor offline, nor
# left out of the round open (not drawn). The idle fraction, everywhere it is shown (fedlm
# show per worker and overall, the dashboard's headline and per-worker table), goodput and
# the yardstick's shares are of this time (docs/fleets_over_time.md, docs/sampling.md).
PRESENT_KINDS = tuple(k for k in COUNTED_KINDS
                      if k not in (IntervalKind.ABSENT.value, IntervalKind.OFFLINE.value,
                                   IntervalKind.NOT_DRAWN.value))


def idle_fraction(seconds: dict) -> float:
    """Idle over present time, from seconds per interval kind (0 if never present)."""
    present = sum(seconds.get(k, 0.0) for k in PRESENT_KINDS)
    return seconds.get(IntervalKind.IDLE.value, 0.0) / present if present > 0 else 0.0


# The kinds that are communication the worker waits for (exposed).
EXPOSED_COMM_KINDS = ("download", "upload", "link wait", "exchange")


def schema_version(conn: sqlite3.Connection) -> object | None:
    """The schema version the file records (as stored: normally a string of digits),
    or None where ``meta`` holds none; ``sqlite3.OperationalError`` (no such table)
    where the file has no ``meta`` table."""
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return row[0] if row else None


def stored_version(conn: sqlite3.Connection) -> object | None:
    """``schema_version``, or None where the file has no ``meta`` table (a new file)."""
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone()
    return schema_version(conn) if has_meta else None


def table_names(conn: sqlite3.Connection) -> set[str]:
    """The names of every table (and index) in the file."""
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


def can_migrate(version: object) -> bool:
    """Whether ``version`` (as stored) is one this fedlm upgrades in place."""
    return str(version).isdigit() and int(str(version)) in MIGRATIONS


def create_or_migrate(conn: sqlite3.Connection) -> object | None:
    """Make the schema in a new file, or upgrade an older one to ``SCHEMA_VERSION``;
    give the store its id if it has none. Run inside one write transaction.

    Returns None when done, or the version the file holds when it is one this fedlm
    cannot write (nothing is recorded then; the caller refuses it and rolls back)."""
    held = stored_version(conn)
    if held is not None:
        version = int(held) if str(held).isdigit() else held
        while version in MIGRATIONS:
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            version += 1
        if version != SCHEMA_VERSION:
            return held
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version),))
    else:
        for statement in SCHEMA.split(";\n"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                     (str(SCHEMA_VERSION),))
    conn.execute("INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (uuid.uuid4().hex,))
    return None


def store_id(conn: sqlite3.Connection) -> str:
    """The store's own random id, made with it: a checkpoint names the store it
    belongs to, so a store deleted and made again under the same path (whose run
    ids start over at 1) never takes a checkpoint of the old one for its own."""
    return conn.execute("SELECT value FROM meta WHERE key='store_id'").fetchone()[0]
