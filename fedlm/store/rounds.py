"""A sampled run's rounds, as the store has them (client sampling: a round drawn from the
workers available, ``strategies/sampling.py``): per round, how many were available, drawn
(dispatched), kept (their updates applied), dropped (over-committed: they reported after
the round closed), cut by the deadline or otherwise lost, and the compute they wasted.
Read from the ``round_drawn`` events and the jobs and updates of each base version; the
idle fraction keeps its one definition (``schema.idle_fraction``): this only counts.
"""

from __future__ import annotations

import json
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from fedlm.store.connection import connect_readonly

ROUND_DRAWN = "round_drawn"  # the engine's event (fedlm.engine.runlog)


@dataclass(frozen=True)
class Round:
    version: int  # the model version its jobs start from
    available: int  # workers free and present when it was drawn
    drawn: int  # jobs dispatched
    kept: int  # updates applied
    dropped: int  # updates that came after the round closed (over-committed)
    deadline: int  # jobs cut by the deadline
    lost: int  # jobs lost otherwise (errors, rejected, departed)
    running: int  # jobs still running when the run ended (cancelled then)
    wasted: float  # compute seconds of its dropped and lost jobs


def rounds(path: str | Path, run_id: int) -> list[Round]:
    """Each drawn round of run ``run_id`` in order (none for a run that drew none)."""
    with closing(connect_readonly(path)) as conn:
        offers = [json.loads(d) for (d,) in conn.execute(
            "SELECT detail FROM events WHERE run_id=? AND kind=? ORDER BY id",
            (run_id, ROUND_DRAWN))]
        if not offers:
            return []
        jobs = conn.execute(
            "SELECT j.base_version, j.dispatch_op, j.status, j.reason, u.applied_version, "
            "(SELECT COALESCE(SUM(i.t_end - i.t_start), 0) FROM intervals i WHERE "
            " i.run_id = j.run_id AND i.job_id = j.job_id AND i.kind = 'compute') "
            "FROM jobs j LEFT JOIN updates u ON u.run_id = j.run_id AND u.job_id = j.job_id "
            "WHERE j.run_id=? ORDER BY j.dispatch_op", (run_id,)).fetchall()
    out = []
    for k, offer in enumerate(offers):
        end = offers[k + 1]["op"] if k + 1 < len(offers) else float("inf")
        mine = [j for j in jobs if offer["op"] <= j[1] < end]
        if not mine:
            continue
        kept = sum(1 for j in mine if j[4] is not None)
        dropped = sum(1 for j in mine if j[2] == "done" and j[4] is None)
        deadline = sum(1 for j in mine if j[2] == "lost" and j[3] == "deadline")
        lost = sum(1 for j in mine if j[2] == "lost" and j[3] != "deadline")
        running = sum(1 for j in mine if j[2] == "cancelled")
        wasted = sum(j[5] for j in mine if j[4] is None and j[2] != "cancelled")
        out.append(Round(mine[0][0], len(offer["offered"]), len(mine), kept, dropped,
                         deadline, lost, running, wasted))
    return out
