"""The dashboard's reads: rows of the run database as pandas frames.

Every function opens the run database read-only (``connect_readonly``), so the
dashboard never blocks, nor is blocked by, a run that is writing. Heavy tables
are aggregated in SQL: per-worker totals with GROUP BY, and the Gantt chart
reads only a recent window of intervals, so a run of 100k intervals stays fast.
``dashboard/queries.py`` shapes these rows for the page (and ``dashboard/app.py``
caches them, keyed by ``change_marker``). Not imported by ``fedlm.store`` itself:
it needs pandas, which the CLI does not load.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pandas as pd

from fedlm.store.connection import connect_readonly
from fedlm.store.readers import shown_status


def _frame(db: str | Path, sql: str, params: tuple = ()) -> pd.DataFrame:
    with closing(connect_readonly(db)) as conn:
        return pd.read_sql_query(sql, conn, params=params)


def change_marker(db: str | Path) -> tuple:
    """Cheap fingerprint of the database's content. In WAL mode the main file's
    mtime does not move on commit, so count rows instead."""
    with closing(connect_readonly(db)) as conn:
        return tuple(conn.execute(
            "SELECT (SELECT COUNT(*) FROM runs), (SELECT COALESCE(MAX(id), 0) FROM intervals),"
            " (SELECT COALESCE(MAX(id), 0) FROM metrics), (SELECT COUNT(*) FROM updates),"
            " (SELECT COUNT(*) FROM runs WHERE status = 'running')").fetchone()) + tuple(
            (r["id"], shown_status(r)) for r in conn.execute(  # a writer that died writes nothing
                "SELECT id, status, owner_host, owner_pid, owner_started, heartbeat_at FROM runs"
                " WHERE status = 'running'"))


def runs(db: str | Path) -> pd.DataFrame:
    """Every run, oldest first, with its stored status, its writer's columns and its
    config (JSON text: the tokenizer is in it)."""
    return _frame(db, "SELECT id, name, status, strategy, local_steps, profile, model, workers,"
                      " seed, clock, strategy_summary, num_parameters, created_at, finished_at,"
                      " virtual_time, updates, final_hash, error, owner_host, owner_pid,"
                      " owner_started, heartbeat_at, config_json FROM runs ORDER BY id")


def run_configs(db: str | Path) -> pd.DataFrame:
    """Every run's name, seed, stored status and config (JSON text), oldest first:
    what the dashboard groups runs of several seeds by."""
    return _frame(db, "SELECT id, name, seed, status, strategy, profile, config_json FROM runs"
                      " ORDER BY id")


def headline_rows(db: str | Path, run_id: int) -> dict[str, Any]:
    """The raw numbers behind the top of the page for one run: its row (status,
    virtual time, writer), the latest interval end, updates applied, jobs and
    tokens, the last and best perplexity and bits per byte, seconds per kind of
    interval, and the bytes sent down and up."""
    with closing(connect_readonly(db)) as conn:
        run = conn.execute("SELECT status, virtual_time, owner_host, owner_pid, owner_started,"
                           " heartbeat_at, clock FROM runs WHERE id=?", (run_id,)).fetchone()
        vt_now = conn.execute("SELECT COALESCE(MAX(t_end), 0) FROM intervals WHERE run_id=?",
                              (run_id,)).fetchone()[0]
        versions, jobs, tokens = conn.execute(
            "SELECT COALESCE(MAX(applied_version), 0), COUNT(*), COALESCE(SUM(tokens), 0)"
            " FROM updates WHERE run_id=?", (run_id,)).fetchone()
        ppl = conn.execute("SELECT perplexity, bits_per_byte FROM metrics WHERE run_id=?"
                           " ORDER BY id DESC LIMIT 1", (run_id,)).fetchone()
        best, best_bpb = conn.execute("SELECT MIN(perplexity), MIN(bits_per_byte) FROM metrics"
                                      " WHERE run_id=?", (run_id,)).fetchone()
        spans = dict(conn.execute("SELECT kind, SUM(t_end - t_start) FROM intervals"
                                  " WHERE run_id=? GROUP BY kind", (run_id,)).fetchall())
        sent = conn.execute("SELECT COALESCE(SUM(down_bytes), 0), COALESCE(SUM(up_bytes), 0)"
                            " FROM jobs WHERE run_id=?", (run_id,)).fetchone()
    return {"run": run, "latest_time": vt_now, "versions": versions, "jobs": jobs,
            "tokens": tokens, "perplexity": ppl[0] if ppl else None, "best_perplexity": best,
            "bits_per_byte": ppl[1] if ppl else None, "best_bits_per_byte": best_bpb,
            "spans": spans, "bytes_down": sent[0], "bytes_up": sent[1]}


def interval_seconds(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per worker and kind of interval: seconds in all (worker, kind, seconds)."""
    return _frame(db, "SELECT worker, kind, SUM(t_end - t_start) AS seconds FROM intervals"
                      " WHERE run_id=? GROUP BY worker, kind", (run_id,))


def updates_per_worker(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per worker: updates handed to the strategy (worker, updates)."""
    return _frame(db, "SELECT worker, COUNT(*) AS updates FROM updates WHERE run_id=?"
                      " GROUP BY worker", (run_id,))


def bytes_up_per_worker(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per worker: bytes its jobs sent up, encoded (worker, bytes_up)."""
    return _frame(db, "SELECT worker, COALESCE(SUM(up_bytes), 0) AS bytes_up FROM jobs"
                      " WHERE run_id=? GROUP BY worker", (run_id,))


def worker_profiles(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per worker: its profile's step time and region (worker, step_time, region)."""
    return _frame(db, "SELECT worker, step_time, region FROM workers WHERE run_id=?", (run_id,))


def latest_time(db: str | Path, run_id: int) -> float:
    """The latest virtual time the run's intervals reach (0 before the first)."""
    with closing(connect_readonly(db)) as conn:
        return conn.execute("SELECT COALESCE(MAX(t_end), 0) FROM intervals WHERE run_id=?",
                            (run_id,)).fetchone()[0]


def intervals_ending_after(db: str | Path, run_id: int, since: float,
                           limit: int) -> pd.DataFrame:
    """Intervals ending at or after ``since``, latest first (at most ``limit``); spans
    of jobs that were lost (crash, rejected update, missed deadline) have the kind
    ``lost job``, so a fault is visible on the timeline where it happened."""
    return _frame(db, "SELECT i.worker, CASE WHEN j.status = 'lost' THEN 'lost job'"
                      " ELSE i.kind END AS kind, i.t_start, i.t_end, i.version, i.job_id,"
                      " j.shard, j.cursor"
                      " FROM intervals i LEFT JOIN jobs j"
                      " ON j.run_id = i.run_id AND j.job_id = i.job_id"
                      " WHERE i.run_id=? AND i.t_end >= ? ORDER BY i.t_end DESC LIMIT ?",
                  (run_id, since, limit))


def running_jobs(db: str | Path, run_id: int) -> pd.DataFrame:
    """Jobs dispatched and not finished, as spans from their dispatch (no ``t_end``)."""
    return _frame(db, "SELECT worker, 'in flight' AS kind, t_dispatch AS t_start,"
                      " base_version AS version, job_id, shard, cursor FROM jobs WHERE run_id=?"
                      " AND status='running'", (run_id,))


def shard_totals(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per data shard: done jobs, inner steps, workers, how far its schedule got."""
    return _frame(db, "SELECT shard, COUNT(*) AS jobs, SUM(local_steps) AS steps,"
                      " COUNT(DISTINCT worker) AS workers, MAX(cursor + local_steps) AS cursor"
                      " FROM jobs WHERE run_id=? AND status='done' AND shard IS NOT NULL"
                      " GROUP BY shard ORDER BY shard", (run_id,))


def metrics(db: str | Path, run_ids: list[int]) -> pd.DataFrame:
    """Every evaluation of the runs ``run_ids`` (not empty), with each run's name and
    strategy, in order."""
    marks = ",".join("?" * len(run_ids))
    return _frame(db, "SELECT m.run_id, r.name, r.strategy, m.version AS updates,"
                      " m.virtual_time, m.wall_time, m.tokens, m.jobs, m.loss, m.perplexity,"
                      " m.bits_per_byte FROM metrics m JOIN runs r ON r.id = m.run_id"
                      f" WHERE m.run_id IN ({marks}) ORDER BY m.run_id, m.id", tuple(run_ids))


def staleness_counts(db: str | Path, run_id: int) -> pd.DataFrame:
    """Updates per staleness (staleness, updates)."""
    return _frame(db, "SELECT staleness, COUNT(*) AS updates FROM updates WHERE run_id=?"
                      " GROUP BY staleness ORDER BY staleness", (run_id,))


def faults_injected(db: str | Path, run_id: int) -> pd.DataFrame:
    """Injected faults per worker and kind (worker, detail, n)."""
    return _frame(db, "SELECT worker, detail, COUNT(*) AS n FROM events WHERE run_id=?"
                      " AND kind='fault_injected' GROUP BY worker, detail", (run_id,))


def lost_jobs(db: str | Path, run_id: int) -> pd.DataFrame:
    """Lost jobs per worker and reason (worker, reason, n)."""
    return _frame(db, "SELECT worker, reason, COUNT(*) AS n FROM jobs WHERE run_id=?"
                  " AND status='lost' GROUP BY worker, reason", (run_id,))


def ignored_and_offline(db: str | Path, run_id: int) -> pd.DataFrame:
    """Late and duplicate replies and offline periods per worker (worker, kind, n)."""
    return _frame(db, "SELECT COALESCE(e.worker, j.worker) AS worker, e.kind, COUNT(*) AS n"
                      " FROM events e LEFT JOIN jobs j ON j.run_id = e.run_id"
                      " AND j.job_id = e.job_id WHERE e.run_id=? AND e.kind IN"
                      " ('late_reply', 'duplicate_reply', 'worker_offline')"
                      " GROUP BY 1, e.kind", (run_id,))


def recent_events(db: str | Path, run_id: int, limit: int) -> pd.DataFrame:
    """The run's latest ``limit`` events, newest first."""
    return _frame(db, "SELECT virtual_time, kind, worker, job_id, detail FROM events"
                      " WHERE run_id=? ORDER BY id DESC LIMIT ?", (run_id, limit))


def transfers(db: str | Path, run_id: int) -> pd.DataFrame:
    """A two-level strategy's transfers that arrived (kind, region, bytes, t_sent,
    t_arrived, staleness, version), in order of arrival; empty for other strategies."""
    return _frame(db, "SELECT kind, region, bytes, t_sent, t_arrived, staleness, version"
                      " FROM transfers WHERE run_id=? ORDER BY op", (run_id,))


def update_arrivals(db: str | Path, run_id: int) -> pd.DataFrame:
    """Every update handed to the strategy: (worker, t_done, staleness), in order."""
    return _frame(db, "SELECT worker, t_done, staleness FROM updates WHERE run_id=?"
                      " ORDER BY op", (run_id,))
