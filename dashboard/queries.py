"""Read-only queries behind the dashboard.

Every function opens the run database read-only (``mode=ro``), so the
dashboard never blocks — nor is blocked by — a run that is writing. Heavy
tables are aggregated in SQL: per-worker totals with GROUP BY, and the Gantt
chart reads only a recent window of intervals, so a run of 100k intervals
stays fast.
"""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path

import pandas as pd

from fedlm.store import connect_readonly, last_seen, shown_status


def _query(db: str | Path, sql: str, params: tuple = ()) -> pd.DataFrame:
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
    """Every run; ``status`` is what readers show (``crashed``: its writer is gone)."""
    frame = _query(db, "SELECT id, name, status, strategy, local_steps, profile, model, workers,"
                       " seed, mode, strategy_summary, num_parameters, created_at, finished_at,"
                       " virtual_time, updates, final_hash, error, owner_host, owner_pid,"
                       " owner_started, heartbeat_at FROM runs ORDER BY id")
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    frame["status"] = [shown_status(r) for r in rows]
    frame["last_seen"] = [last_seen(r) for r in rows]
    return frame


def run_config(db: str | Path, run_id: int) -> dict:
    frame = _query(db, "SELECT config_json FROM runs WHERE id=?", (run_id,))
    return json.loads(frame.iloc[0, 0]) if len(frame) else {}


def headline(db: str | Path, run_id: int) -> dict:
    """The numbers at the top of the page for one run."""
    with closing(connect_readonly(db)) as conn:
        r = conn.execute("SELECT status, virtual_time, owner_host, owner_pid, owner_started,"
                         " heartbeat_at FROM runs WHERE id=?", (run_id,)).fetchone()
        vt_now = conn.execute("SELECT COALESCE(MAX(t_end), 0) FROM intervals WHERE run_id=?",
                              (run_id,)).fetchone()[0]
        versions, jobs, tokens = conn.execute(
            "SELECT COALESCE(MAX(applied_version), 0), COUNT(*), COALESCE(SUM(tokens), 0)"
            " FROM updates WHERE run_id=?", (run_id,)).fetchone()
        ppl = conn.execute("SELECT perplexity FROM metrics WHERE run_id=? ORDER BY id DESC"
                           " LIMIT 1", (run_id,)).fetchone()
        best = conn.execute("SELECT MIN(perplexity) FROM metrics WHERE run_id=?",
                            (run_id,)).fetchone()[0]
        spans = dict(conn.execute("SELECT kind, SUM(t_end - t_start) FROM intervals"
                                  " WHERE run_id=? GROUP BY kind", (run_id,)).fetchall())
        sent = conn.execute("SELECT COALESCE(SUM(down_bytes), 0), COALESCE(SUM(up_bytes), 0)"
                            " FROM jobs WHERE run_id=?", (run_id,)).fetchone()
    total = sum(spans.values())
    return {"status": shown_status(r), "virtual_time": r["virtual_time"] or vt_now,
            "updates": versions, "jobs": jobs, "tokens": tokens,
            "perplexity": ppl[0] if ppl else None, "best_perplexity": best,
            "idle": spans.get("idle", 0.0), "idle_fraction": spans.get("idle", 0.0) / total
            if total else 0.0, "bytes_down": sent[0], "bytes_up": sent[1],
            "link_wait": spans.get("link wait", 0.0)}


def worker_totals(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per worker: seconds per kind of interval, idle fraction, jobs and updates."""
    spans = _query(db, "SELECT worker, kind, SUM(t_end - t_start) AS seconds FROM intervals"
                       " WHERE run_id=? GROUP BY worker, kind", (run_id,))
    wide = spans.pivot_table(index="worker", columns="kind", values="seconds",
                             fill_value=0.0).reset_index()
    for kind in ("download", "compute", "upload", "link wait", "idle"):
        if kind not in wide:
            wide[kind] = 0.0
    counts = _query(db, "SELECT worker, COUNT(*) AS updates FROM updates WHERE run_id=?"
                        " GROUP BY worker", (run_id,))
    sent = _query(db, "SELECT worker, COALESCE(SUM(up_bytes), 0) AS bytes_up FROM jobs"
                      " WHERE run_id=? GROUP BY worker", (run_id,))
    counts = counts.merge(sent, on="worker", how="outer")
    prof = _query(db, "SELECT worker, step_time, region FROM workers WHERE run_id=?", (run_id,))
    out = prof.merge(wide, on="worker", how="left").merge(counts, on="worker", how="left")
    out = out.fillna({"download": 0.0, "compute": 0.0, "upload": 0.0, "link wait": 0.0,
                      "idle": 0.0, "updates": 0, "bytes_up": 0})
    total = out[["download", "compute", "upload", "link wait", "idle"]].sum(axis=1)
    out["idle_fraction"] = (out["idle"] / total.where(total > 0)).fillna(0.0)
    out["updates"] = out["updates"].astype(int)
    return out


def recent_intervals(db: str | Path, run_id: int, window: float,
                     limit: int = 5000) -> pd.DataFrame:
    """Intervals ending in the last ``window`` virtual seconds (at most ``limit``)."""
    with closing(connect_readonly(db)) as conn:
        end = conn.execute("SELECT COALESCE(MAX(t_end), 0) FROM intervals WHERE run_id=?",
                           (run_id,)).fetchone()[0]
    # Spans of jobs that were lost (crash, rejected update, missed deadline) are
    # drawn as such, so a fault is visible on the timeline where it happened.
    return _query(db, "SELECT i.worker, CASE WHEN j.status = 'lost' THEN 'lost job'"
                      " ELSE i.kind END AS kind, i.t_start, i.t_end, i.version, i.job_id,"
                      " j.shard, j.cursor"
                      " FROM intervals i LEFT JOIN jobs j"
                      " ON j.run_id = i.run_id AND j.job_id = i.job_id"
                      " WHERE i.run_id=? AND i.t_end >= ? ORDER BY i.t_end DESC LIMIT ?",
                  (run_id, end - window, limit))


def in_flight(db: str | Path, run_id: int) -> pd.DataFrame:
    """Jobs dispatched and not finished, drawn from dispatch to the latest known time."""
    with closing(connect_readonly(db)) as conn:
        now = conn.execute("SELECT COALESCE(MAX(t_end), 0) FROM intervals WHERE run_id=?",
                           (run_id,)).fetchone()[0]
    frame = _query(db, "SELECT worker, 'in flight' AS kind, t_dispatch AS t_start,"
                       " base_version AS version, job_id, shard, cursor FROM jobs WHERE run_id=?"
                       " AND status='running'", (run_id,))
    frame["t_end"] = now
    return frame[frame["t_end"] > frame["t_start"]]


def shards(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per data shard: jobs and inner steps trained on it (done jobs), by how many
    workers, and how far its schedule got (empty for runs recorded before shards)."""
    return _query(db, "SELECT shard, COUNT(*) AS jobs, SUM(local_steps) AS steps,"
                      " COUNT(DISTINCT worker) AS workers, MAX(cursor + local_steps) AS cursor"
                      " FROM jobs WHERE run_id=? AND status='done' AND shard IS NOT NULL"
                      " GROUP BY shard ORDER BY shard", (run_id,))


def metrics(db: str | Path, run_ids: list[int]) -> pd.DataFrame:
    if not run_ids:
        return pd.DataFrame()
    marks = ",".join("?" * len(run_ids))
    return _query(db, "SELECT m.run_id, r.name, r.strategy, m.version AS updates,"
                      " m.virtual_time, m.wall_time, m.tokens, m.jobs, m.loss, m.perplexity,"
                      " m.bits_per_byte FROM metrics m JOIN runs r ON r.id = m.run_id"
                      f" WHERE m.run_id IN ({marks}) ORDER BY m.run_id, m.id", tuple(run_ids))


def staleness(db: str | Path, run_id: int) -> pd.DataFrame:
    return _query(db, "SELECT staleness, COUNT(*) AS updates FROM updates WHERE run_id=?"
                      " GROUP BY staleness ORDER BY staleness", (run_id,))


FAILURE_COLUMNS = ["faults injected", "lost: error", "lost: rejected", "lost: deadline",
                   "retired", "late or duplicate replies", "offline periods"]


def failures(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per worker: injected faults by kind, lost jobs by reason, ignored replies,
    offline periods (empty when the run had none of these)."""
    injected = _query(db, "SELECT worker, detail, COUNT(*) AS n FROM events WHERE run_id=?"
                          " AND kind='fault_injected' GROUP BY worker, detail", (run_id,))
    lost = _query(db, "SELECT worker, reason, COUNT(*) AS n FROM jobs WHERE run_id=?"
                      " AND status='lost' GROUP BY worker, reason", (run_id,))
    other = _query(db, "SELECT COALESCE(e.worker, j.worker) AS worker, e.kind, COUNT(*) AS n"
                       " FROM events e LEFT JOIN jobs j ON j.run_id = e.run_id"
                       " AND j.job_id = e.job_id WHERE e.run_id=? AND e.kind IN"
                       " ('late_reply', 'duplicate_reply', 'worker_offline')"
                       " GROUP BY 1, e.kind", (run_id,))
    if injected.empty and lost.empty and other.empty:
        return pd.DataFrame()
    workers = sorted(set(injected["worker"]) | set(lost["worker"]) | set(other["worker"]))
    rows = []
    for w in workers:
        inj = injected[injected["worker"] == w]
        ls = dict(zip(*lost[lost["worker"] == w][["reason", "n"]].values.T)) \
            if (lost["worker"] == w).any() else {}
        ot = dict(zip(*other[other["worker"] == w][["kind", "n"]].values.T)) \
            if (other["worker"] == w).any() else {}
        rows.append({"worker": int(w),
                     "faults injected": ", ".join(f"{d} x{n}" for d, n in
                                                  zip(inj["detail"], inj["n"])) or "-",
                     "lost: error": int(ls.get("error", 0)),
                     "lost: rejected": int(ls.get("rejected", 0)),
                     "lost: deadline": int(ls.get("deadline", 0)),
                     "retired": "yes" if ls.get("retired") else "",
                     "late or duplicate replies": int(ot.get("late_reply", 0)
                                                      + ot.get("duplicate_reply", 0)),
                     "offline periods": int(ot.get("worker_offline", 0))})
    return pd.DataFrame(rows, columns=["worker", *FAILURE_COLUMNS])


def events(db: str | Path, run_id: int, limit: int = 200) -> pd.DataFrame:
    return _query(db, "SELECT virtual_time, kind, worker, job_id, detail FROM events"
                      " WHERE run_id=? ORDER BY id DESC LIMIT ?", (run_id, limit))
