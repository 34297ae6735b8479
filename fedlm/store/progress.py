"""A run's progress points: each evaluation, with what the fleet had done by then.

One point per row of ``metrics`` (validation loss, perplexity and bits per byte
at a version, with its tokens and virtual time), joined with the run's running
totals up to the evaluation's virtual time ``t``:

- ``idle_fraction``: idle time over compute + exposed communication + idle time,
  counting the spans that had ended by ``t`` (as ``fedlm show``'s idle share);
- ``mean_staleness``: of the updates that had arrived by ``t`` (0 before any);
- ``bytes_down`` / ``bytes_up``: models sent to workers by ``t``, and the encoded
  updates that had arrived by ``t``;
- ``lost_jobs``: jobs lost by ``t`` (crash, deadline, rejected update, retired).

The experiment trackers (``fedlm.track``) read these, live while the run writes
(``after``: the last point already taken) and afterwards for ``fedlm export``:
both see the same rows, since each evaluation commits everything before it.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import NamedTuple

from fedlm.store.connection import connect_readonly
from fedlm.store.schema import EXPOSED_COMM_KINDS, IntervalKind


class ProgressPoint(NamedTuple):
    id: int  # the metrics row: points come in this order
    version: int
    virtual_time: float
    wall_time: float
    tokens: int
    jobs: int
    loss: float
    perplexity: float
    bits_per_byte: float
    idle_fraction: float
    mean_staleness: float
    bytes_down: int
    bytes_up: int
    lost_jobs: int


_ACCOUNTED = (IntervalKind.COMPUTE.value, IntervalKind.IDLE.value, *EXPOSED_COMM_KINDS)
_POINTS = f"""
SELECT m.id, m.version, m.virtual_time, m.wall_time, m.tokens, m.jobs, m.loss,
       m.perplexity, m.bits_per_byte,
       (SELECT COALESCE(SUM(i.t_end - i.t_start), 0) FROM intervals i
         WHERE i.run_id = m.run_id AND i.t_end <= m.virtual_time AND i.kind = ?),
       (SELECT COALESCE(SUM(i.t_end - i.t_start), 0) FROM intervals i
         WHERE i.run_id = m.run_id AND i.t_end <= m.virtual_time
           AND i.kind IN ({", ".join("?" * len(_ACCOUNTED))})),
       (SELECT COALESCE(AVG(u.staleness), 0) FROM updates u
         WHERE u.run_id = m.run_id AND u.t_done <= m.virtual_time),
       (SELECT COALESCE(SUM(j.down_bytes), 0) FROM jobs j
         WHERE j.run_id = m.run_id AND j.t_dispatch <= m.virtual_time),
       (SELECT COALESCE(SUM(j.up_bytes), 0) FROM updates u JOIN jobs j
         ON j.run_id = u.run_id AND j.job_id = u.job_id
         WHERE u.run_id = m.run_id AND u.t_done <= m.virtual_time),
       (SELECT COUNT(*) FROM events e
         WHERE e.run_id = m.run_id AND e.kind = 'job_failed' AND e.virtual_time <= m.virtual_time)
FROM metrics m WHERE m.run_id = ? AND m.id > ? ORDER BY m.id"""


def progress_points(path: str | Path, run_id: int, after: int = 0) -> list[ProgressPoint]:
    """Run ``run_id``'s progress points whose metrics row id is past ``after``, in order."""
    with closing(connect_readonly(path)) as conn:
        rows = conn.execute(_POINTS, (IntervalKind.IDLE.value, *_ACCOUNTED, run_id,
                                      after)).fetchall()
    return [ProgressPoint(*row[:9], idle / accounted if accounted else 0.0, float(stale),
                          int(down), int(up), int(lost))
            for *row, idle, accounted, stale, down, up, lost in rows]
