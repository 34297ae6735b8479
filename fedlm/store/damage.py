"""Damaged rows of the run store: which column of which row holds what it cannot.

A store is a file anyone can edit (`sqlite3 DB "update runs set ..."`), and SQLite
keeps whatever is put in a column whatever its declared type. A reader checks the
values it reads against the schema's types before it uses them: a damaged row is
listed as damaged (``list_runs``) and any command that needs the run says, in one
line, which column of which row holds what (``damage``), instead of a traceback.

``row_damage`` checks a row of ``runs`` as read (``list_runs`` lists a damaged run
as damaged, beside the others); ``damage`` checks every row of one run, each table at
once in SQL (``typeof``), before ``summarize``, replay, resume or export use them.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, NamedTuple

from fedlm.store.connection import StoreError, connect_readonly
from fedlm.store.schema import TABLES

# typeof() each declared type accepts (REAL columns keep integers as integers)
_TYPEOF = {"INTEGER": ("integer",), "REAL": ("real", "integer"), "TEXT": ("text",)}
_KIND = {"INTEGER": "an integer", "REAL": "a number", "TEXT": "text"}
MAX_PID = 2**31 - 1  # pid_t: a larger owner_pid was never written by a process


class Column(NamedTuple):
    name: str
    declared: str  # INTEGER | REAL | TEXT
    nullable: bool


def columns(conn: sqlite3.Connection, table: str) -> list[Column]:
    """The columns of ``table`` with their declared types, from the file's own schema."""
    return [Column(name, (declared or "").upper(), not notnull and not pk)
            for _, name, declared, notnull, _, pk in conn.execute(f"PRAGMA table_info({table})")]


def shown_value(value: Any) -> str:
    """A stored value for a message: short, and binary data by its size."""
    if isinstance(value, bytes):
        return f"{len(value)} bytes of binary data"
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def value_damage(value: Any, column: Column) -> str | None:
    """Why ``value`` cannot be a value of ``column`` (a phrase), or None."""
    if value is None:
        return None if column.nullable else "is missing"
    ok = {"INTEGER": lambda v: isinstance(v, int),
          "REAL": lambda v: isinstance(v, (int, float)),
          "TEXT": lambda v: isinstance(v, str)}.get(column.declared, lambda v: True)
    if not ok(value):
        return f"is {shown_value(value)}, not {_KIND[column.declared]}"
    return None


def config_damage(config_json: Any) -> str | None:
    """Why a stored config cannot be read (a phrase), or None."""
    if not isinstance(config_json, str):
        return f"is {shown_value(config_json)}, not a JSON text"
    try:
        config = json.loads(config_json)
    except (ValueError, RecursionError):
        return f"is not JSON ({shown_value(config_json)})"
    if not isinstance(config, dict):
        return f"is JSON but not an object ({shown_value(config_json)})"
    data = config.get("data", {})
    if not isinstance(data, dict) or not isinstance(data.get("tokenizer", "byte"), str):
        return f"has no readable data.tokenizer ({shown_value(config_json)})"
    return None


def row_damage(run: sqlite3.Row | dict, cols: list[Column] | None = None) -> str | None:
    """What is damaged in a row of ``runs`` (``COLUMN VALUE-phrase``), or None. ``cols``:
    the table's columns (``columns``); without them, the config and owner are checked."""
    for column in cols or []:
        why = value_damage(run[column.name], column)
        if why:
            return f"runs.{column.name} {why}"
    why = config_damage(run["config_json"])
    if why:
        return f"runs.config_json {why}"
    pid = run["owner_pid"]
    if isinstance(pid, int) and not pid <= MAX_PID:
        return f"runs.owner_pid is {shown_value(pid)}, not a process id"
    return None


# what list_runs reads of a run's other tables, as columns, and where each comes from
_LISTED = {Column("last_perplexity", "REAL", True): "metrics.perplexity",
           Column("last_bits_per_byte", "REAL", True): "metrics.bits_per_byte",
           Column("applied", "INTEGER", True): "updates.applied_version",
           Column("evaluated", "INTEGER", True): "metrics.version"}


def listed_damage(run: sqlite3.Row, cols: list[Column]) -> str | None:
    """What is damaged of what ``list_runs`` reads of a run: its row of ``runs`` (with
    ``cols``) and the last evaluation and newest versions it lists; or None."""
    return row_damage(run, cols) or next(
        (f"{source} {why}" for c, source in _LISTED.items()
         for why in [value_damage(run[c.name], c)] if why), None)


def damage(path: str | Path, run_id: int) -> str | None:
    """What is damaged among run ``run_id``'s rows, every table (one line: the table, the
    row, the column and what it holds), or None; ``KeyError`` if there is no such run.
    SQLite finds a value of the wrong type in each table (``typeof``); the run's config
    and its drawn rounds (JSON) are read too."""
    with closing(connect_readonly(path)) as conn:
        run = conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if run is None:
            raise KeyError(f"no run {run_id} in {path}")
        why = row_damage(run, columns(conn, "runs"))
        if why:
            return why
        for table in TABLES[1:]:
            cols = columns(conn, table)
            wrong = " OR ".join(
                f"typeof({c.name}) NOT IN ({', '.join(map(repr, _TYPEOF[c.declared]))}"
                f"{', ' + repr('null') if c.nullable else ''})"
                for c in cols if c.declared in _TYPEOF)
            row = conn.execute(f"SELECT rowid AS rowid_, * FROM {table} WHERE run_id=? AND "
                               f"({wrong}) LIMIT 1", (run_id,)).fetchone()
            if row is not None:
                column, why = next((c, w) for c in cols
                                   for w in [value_damage(row[c.name], c)] if w)
                return f"{table} row {row['rowid_']} (rowid): {column.name} {why}"
        for rowid, detail in conn.execute("SELECT id, detail FROM events WHERE run_id=? AND "
                                          "kind='round_drawn' ORDER BY id", (run_id,)):
            try:
                offer = json.loads(detail)
                ok = isinstance(offer["op"], int) and isinstance(offer["offered"], list)
            except (ValueError, TypeError, KeyError, RecursionError):
                ok = False
            if not ok:
                return (f"events row {rowid} (rowid): the detail of a round_drawn event is "
                        f"not a drawn round ({shown_value(detail)})")
    return None


def refuse_damaged(path: str | Path, run_id: int) -> None:
    """``StoreError`` in one line if run ``run_id``'s rows are damaged (``damage``)."""
    why = damage(path, run_id)
    if why:
        raise StoreError(f"run {run_id} in {path} is damaged: {why}")
