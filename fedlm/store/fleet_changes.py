"""A fleet that changed over time, per worker: what ``fedlm show`` and the trackers count.

Read from what the engine wrote (``fedlm.engine.presence``): the ``absent`` and
``slowed`` intervals, the ``straggler`` and ``worker_absent`` events and the jobs lost
because their worker went away (``departed``).
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from fedlm.store.connection import connect_readonly


@dataclass(frozen=True)
class WorkerChanges:
    worker: int
    absent: float  # seconds absent (not yet joined, away, gone for good)
    absences: int  # absent periods
    slowed: float  # seconds running slowed
    stragglers: int  # jobs that straggled (a heavy-tailed compute time)
    departed: int  # jobs lost because the worker went away mid-job
    joined: float | None  # when it first came, if it was absent at the start
    left: float | None  # when it left for good, if it did
    never: bool = False  # absent from the start to the run's end: it never took part


def fleet_changes(path: str | Path, run_id: int) -> list[WorkerChanges]:
    """Per worker, how its speed and presence changed; [] for a steady fleet."""
    with closing(connect_readonly(path)) as conn:
        def per_worker(sql: str) -> dict:
            return {w: rest for w, *rest in conn.execute(sql, (run_id,)).fetchall()}

        spans = per_worker("SELECT worker, SUM(t_end - t_start), COUNT(*),"
                           " MIN(t_start), MIN(t_end) FROM intervals"
                           " WHERE run_id=? AND kind='absent' GROUP BY worker")
        slowed = per_worker("SELECT worker, SUM(t_end - t_start) FROM intervals"
                            " WHERE run_id=? AND kind='slowed' GROUP BY worker")
        straggled = per_worker("SELECT worker, COUNT(*) FROM events WHERE run_id=?"
                               " AND kind='straggler' GROUP BY worker")
        departed = per_worker("SELECT worker, COUNT(*) FROM jobs WHERE run_id=?"
                              " AND status='lost' AND reason='departed' GROUP BY worker")
        left = per_worker("SELECT worker, MIN(virtual_time) FROM events WHERE run_id=?"
                          " AND kind='worker_absent' AND detail='left for good'"
                          " GROUP BY worker")
        workers = [w for (w,) in conn.execute(
            "SELECT worker FROM workers WHERE run_id=? ORDER BY worker", (run_id,))]
        end = conn.execute("SELECT COALESCE(MAX(t_end), 0) FROM intervals WHERE run_id=?",
                           (run_id,)).fetchone()[0]
    if not (spans or slowed or straggled or departed):
        return []
    out = []
    for w in workers:
        absent, count, first_start, first_end = spans.get(w, (0.0, 0, None, None))
        never = first_start == 0.0 and end > 0 and first_end >= end
        out.append(WorkerChanges(
            w, absent or 0.0, count, (slowed.get(w) or [0.0])[0] or 0.0,
            (straggled.get(w) or [0])[0], (departed.get(w) or [0])[0],
            first_end if first_start == 0.0 and not never else None,
            (left.get(w) or [None])[0], never))
    return out
