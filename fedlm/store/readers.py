"""Reading runs: listings, configs, and the rows others need (a run's summary and
troubles, for ``fedlm show``, are ``fedlm.store.summary``'s).

Every function opens the run database read-only (``connect_readonly``), so a
reader never blocks, nor is blocked by, the runs writing it. The status readers
show is ``shown_status``: a ``running`` run whose writer is gone reads as
``crashed`` (``fedlm.ownership``), without anyone writing that down.

Who reads what: the CLI (``list_runs``, ``run_row``, ``replayable_row``), ``fedlm.replay`` (``operation_log``), ``fedlm.start``
(``run_row``: a finished run's weights to start from), ``fedlm.runner``
(``best_loss``: a resumed run's divergence check). A run's series (its curves, the
bytes it moved) are ``fedlm.store.series``'s; the dashboard's queries are in
``fedlm.store.dashboard``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any, NamedTuple

from fedlm import ownership
from fedlm.store.connection import StoreError, connect_readonly
from fedlm.store.damage import (Column, columns, config_damage, damage, listed_damage,
                                refuse_damaged, shown_value)

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
    if not seen:
        return "never"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seen))
    except (OverflowError, OSError, ValueError, TypeError):  # a damaged time
        return f"at {shown_value(seen)} (not a time)"


def tokenizer_of(config_json: str) -> str:
    """``data.tokenizer`` of a stored config; ``byte`` for runs stored before it was a
    setting (they all used bytes); ``damaged`` for a config that cannot be read
    (``row_damage`` says what is wrong with it)."""
    if config_damage(config_json):
        return "damaged"
    return json.loads(config_json).get("data", {}).get("tokenizer", "byte")


def list_runs(path: str | Path) -> list[dict[str, Any]]:
    """Every run, oldest first, with ``last_perplexity`` and ``last_bits_per_byte``,
    its ``tokenizer``, the status readers show (``shown_status``: ``crashed`` where the
    writer is gone) and the versions it reached (``reached``)."""
    with closing(connect_readonly(path)) as conn:
        rows = conn.execute(
            "SELECT r.*, (SELECT perplexity FROM metrics m WHERE m.run_id = r.id"
            " ORDER BY m.id DESC LIMIT 1) AS last_perplexity,"
            " (SELECT bits_per_byte FROM metrics m WHERE m.run_id = r.id"
            " ORDER BY m.id DESC LIMIT 1) AS last_bits_per_byte,"
            " (SELECT MAX(applied_version) FROM updates u WHERE u.run_id = r.id) AS applied,"
            " (SELECT MAX(version) FROM metrics m WHERE m.run_id = r.id) AS evaluated"
            " FROM runs r ORDER BY r.id"
        ).fetchall()
        cols = columns(conn, "runs")
    return [_listed(r, cols) for r in rows]


def _listed(r: sqlite3.Row, cols: list[Column]) -> dict[str, Any]:
    """One run of the list; a damaged one has ``damaged`` (what is wrong) and
    ``status`` ``damaged``, and nothing read from its damaged values."""
    why = listed_damage(r, cols)
    if why:
        return {**dict(r), "status": "damaged", "damaged": why}
    return {**dict(r), "status": shown_status(r), "reached": _reached(r),
            "tokenizer": tokenizer_of(r["config_json"]), "damaged": None}


def _reached(run: sqlite3.Row) -> int:
    """The versions a run reached: ``updates``, recorded when it ended; for one that
    has not recorded its end (running, crashed: ``updates`` is NULL), the newest
    version its updates or evaluations reached."""
    if run["updates"] is not None:
        return run["updates"]
    return max(run["applied"] or 0, run["evaluated"] or 0)


def config_of(path: str | Path, run_id: int) -> dict[str, Any]:
    """Run ``run_id``'s config, as the dict it was stored from (``KeyError`` if none)."""
    with closing(connect_readonly(path)) as conn:
        row = conn.execute("SELECT config_json FROM runs WHERE id=?", (run_id,)).fetchone()
    if row is None:
        raise KeyError(f"no run {run_id} in {path}")
    why = config_damage(row[0])
    if why:
        raise StoreError(f"run {run_id} in {path} is damaged: runs.config_json {why}")
    return json.loads(row[0])


def run_row(path: str | Path, run_id: int) -> sqlite3.Row | None:
    """Run ``run_id``'s row of ``runs`` (every column, as stored), or None."""
    with closing(connect_readonly(path)) as conn:
        return conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()


def resumable_row(path: str | Path, run_id: int) -> sqlite3.Row:
    """Run ``run_id``'s row if it is a run that can be resumed (``StoreError`` naming
    --resume if not): checked before anything loads, and again when the run is taken
    over (``RunWriter.reopen``)."""
    if not Path(path).exists():
        raise StoreError(f"db: no run database at {path}")
    row = run_row(path, run_id)
    if row is None:
        raise StoreError(f"--resume: no run {run_id} in {path}")
    why = damage(path, run_id)
    if why:
        raise StoreError(f"--resume: run {run_id} in {path} is damaged: {why}")
    if row["status"] == "finished":
        raise StoreError(f"--resume: run {run_id} in {path} has already finished")
    if row["status"] == "diverged":
        raise StoreError(diverged_refusal(path, run_id, row["error"]))
    if shown_status(row) == "running":
        raise StoreError(f"--resume: run {run_id} in {path} is still running (pid "
                         f"{row['owner_pid']} on {row['owner_host']}); two writers would "
                         f"break its log")
    return row


def replayable_row(path: str | Path, run_id: int) -> sqlite3.Row:
    """Run ``run_id``'s row if it is a run that can be replayed: finished (``KeyError``
    for an unknown run, ``StoreError`` saying why not): ``fedlm replay`` asks before
    any library loads or any progress shows."""
    row = run_row(path, run_id)
    if row is None:
        raise KeyError(f"no run {run_id} in {path}")
    refuse_damaged(path, run_id)
    if row["status"] == "diverged":  # stopped early, with no final hash to compare with
        raise StoreError(f"run {run_id} diverged ({row['error'] or 'no reason recorded'}); "
                         f"only finished runs replay")
    if row["status"] != "finished":
        raise StoreError(f"run {run_id} is {shown_status(row)}; only finished runs replay")
    return row


def diverged_refusal(path: str | Path, run_id: int, why: str | None) -> str:
    """Why a diverged run is not resumed: from its checkpoint it would diverge again."""
    return (f"--resume: run {run_id} in {path} diverged ({why or 'no reason recorded'}); "
            f"resuming it would diverge again: start a new run instead")


class OperationLog(NamedTuple):
    """What ``fedlm.replay`` re-executes: a run's row, its jobs by id, and its
    updates in the order the engine handed them to the strategy (by op), and a two-level
    strategy's transfers in the order they arrived (by op)."""

    run: sqlite3.Row
    jobs: dict[int, sqlite3.Row]
    updates: list[sqlite3.Row]
    transfers: list[sqlite3.Row]


def operation_log(path: str | Path, run_id: int) -> OperationLog:
    """Run ``run_id``'s row, jobs, updates and transfers (``KeyError`` if there is no
    such run)."""
    with closing(connect_readonly(path)) as conn:
        run = conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if run is None:
            raise KeyError(f"no run {run_id} in {path}")
        jobs = {r["job_id"]: r for r in conn.execute(
            "SELECT * FROM jobs WHERE run_id=? ORDER BY job_id", (run_id,))}
        updates = conn.execute("SELECT * FROM updates WHERE run_id=? ORDER BY op",
                               (run_id,)).fetchall()
        transfers = conn.execute("SELECT * FROM transfers WHERE run_id=? ORDER BY op",
                                 (run_id,)).fetchall()
    return OperationLog(run, jobs, updates, transfers)


class Work(NamedTuple):
    """What a run's jobs did: inner steps of the jobs that finished and of those lost
    because their worker went away; staleness of the updates; how many there were."""

    steps_done: int
    steps_departed: int
    mean_staleness: float
    max_staleness: int
    updates: int


def work(path: str | Path, run_id: int) -> Work:
    with closing(connect_readonly(path)) as conn:
        done = conn.execute("SELECT COALESCE(SUM(local_steps), 0) FROM jobs WHERE run_id=? "
                            "AND status='done'", (run_id,)).fetchone()[0]
        gone = conn.execute("SELECT COALESCE(SUM(local_steps), 0) FROM jobs WHERE run_id=? "
                            "AND reason='departed'", (run_id,)).fetchone()[0]
        mean, worst, count = conn.execute("SELECT AVG(staleness), MAX(staleness), COUNT(*) "
                                          "FROM updates WHERE run_id=?", (run_id,)).fetchone()
    return Work(done, gone, mean or 0.0, worst or 0, count)


def worker_nodes(path: str | Path, run_id: int) -> list[str | None]:
    """The node that held each worker of run ``run_id``, in worker order (``in-process``
    for a run whose jobs ran in its own process)."""
    with closing(connect_readonly(path)) as conn:
        return [r[0] for r in conn.execute("SELECT node_id FROM workers WHERE run_id=? "
                                           "ORDER BY worker", (run_id,))]


def input_pins(path: str | Path, run_id: int) -> list[str]:
    """The files run ``run_id`` pinned when it began (``fedlm.store.inputs``): its
    ``input_file`` events' details, JSON each."""
    return event_details(path, run_id, "input_file")


def event_details(path: str | Path, run_id: int, kind: str) -> list[str]:
    """The details of run ``run_id``'s events of ``kind``, in order."""
    with closing(connect_readonly(path)) as conn:
        return [r[0] for r in conn.execute("SELECT detail FROM events WHERE run_id=? AND "
                                           "kind=? ORDER BY id", (run_id, kind))]
