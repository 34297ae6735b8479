"""A run's series, read from the store: its evaluations over virtual time (by version,
by tokens trained), its best loss so far, and the bytes its jobs and servers moved.
Who reads them: the sweep report and ``experiments/compare.py`` (the curves and bytes),
``fedlm.runner`` (``best_loss``: a resumed run's divergence check), ``fedlm show``
(``traffic``, ``region_transfers``). Read-only, as every reader (``connect_readonly``).
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

from fedlm.store.connection import connect_readonly


def metric_curve(path: str | Path, run_id: int) -> list[tuple[float, int, float]]:
    """Run ``run_id``'s evaluations in order: (virtual time, version, perplexity)."""
    with closing(connect_readonly(path)) as conn:
        return [tuple(r) for r in conn.execute("SELECT virtual_time, version, perplexity"
                                               " FROM metrics WHERE run_id=? ORDER BY id",
                                               (run_id,)).fetchall()]


def tokens_curve(path: str | Path, run_id: int) -> list[tuple[float, int, float]]:
    """Run ``run_id``'s evaluations in order: (virtual time, tokens trained so far,
    perplexity): where a curve stood after a given amount of work."""
    with closing(connect_readonly(path)) as conn:
        return [tuple(r) for r in conn.execute("SELECT virtual_time, tokens, perplexity"
                                               " FROM metrics WHERE run_id=? ORDER BY id",
                                               (run_id,)).fetchall()]


def best_loss(path: str | Path, run_id: int) -> tuple[float, int] | None:
    """Run ``run_id``'s lowest validation loss and the version that reached it first
    (what a resumed run's divergence check starts from), or None before any."""
    with closing(connect_readonly(path)) as conn:
        row = conn.execute("SELECT loss, version FROM metrics WHERE run_id=? ORDER BY loss, id"
                           " LIMIT 1", (run_id,)).fetchone()
    return (float(row[0]), int(row[1])) if row else None


def uploaded_bytes(path: str | Path, run_id: int) -> float:
    """Bytes the workers' finished jobs of run ``run_id`` sent up, as encoded on the wire."""
    with closing(connect_readonly(path)) as conn:
        row = conn.execute("SELECT COALESCE(SUM(up_bytes), 0) FROM jobs WHERE run_id=?"
                           " AND status='done'", (run_id,)).fetchone()
    return float(row[0])


def traffic(path: str | Path, run_id: int) -> dict[str, float]:
    """What run ``run_id``'s jobs moved: bytes down and up in all, and the most one
    exchange moved either way, leaving out each worker's first download (the whole
    model, whatever the strategy: what streaming changes is every later exchange)."""
    with closing(connect_readonly(path)) as conn:
        down, up, peak_up = conn.execute(
            "SELECT COALESCE(SUM(down_bytes), 0), COALESCE(SUM(up_bytes), 0),"
            " COALESCE(MAX(up_bytes), 0) FROM jobs WHERE run_id=?", (run_id,)).fetchone()
        peak_down = conn.execute(
            "SELECT COALESCE(MAX(down_bytes), 0) FROM jobs WHERE run_id=? AND job_id NOT IN"
            " (SELECT MIN(job_id) FROM jobs WHERE run_id=? GROUP BY worker)",
            (run_id, run_id)).fetchone()[0]
    return {"down": float(down), "up": float(up),
            "peak_exchange": float(max(peak_down, peak_up))}


def region_transfers(path: str | Path, run_id: int) -> list[dict[str, Any]]:
    """The traffic of a run whose servers exchange messages (halos; a pipelined server),
    per region in order of the region's first worker: name, pushes, their mean staleness
    (versions of the model they reach), the models that came back, bytes each way. []
    for other runs."""
    with closing(connect_readonly(path)) as conn:
        rows = conn.execute("SELECT region, kind, COUNT(*), AVG(staleness), SUM(bytes)"
                            " FROM transfers WHERE run_id=? GROUP BY region, kind",
                            (run_id,)).fetchall()
        workers = conn.execute("SELECT region FROM workers WHERE run_id=? ORDER BY worker",
                               (run_id,)).fetchall()
    names = list(dict.fromkeys(r[0] for r in workers))
    out: dict[int, dict[str, Any]] = {}
    for region, kind, n, staleness, nbytes in rows:
        if region < 0:  # an older fedlm's deadline, a message to itself: no link
            continue
        row = out.setdefault(region, {"region": names[region] if region < len(names)
                                      else str(region), "pushes": 0, "push_staleness": 0.0,
                                      "models": 0, "bytes_up": 0, "bytes_down": 0})
        if kind == "push":
            row.update(pushes=n, push_staleness=staleness, bytes_up=nbytes)
        else:
            row.update(models=n, bytes_down=nbytes)
    return [out[r] for r in sorted(out)]
