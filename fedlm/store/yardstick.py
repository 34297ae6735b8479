"""A run against its fleet's yardstick (``fedlm.sim.bound``): the least virtual time its
fleet needs for the inner steps it trained, its own time as a multiple of that, its
goodput and where the rest of the workers' present time went. Read from the store alone:
each worker's step time and link (``workers``), the bytes its jobs moved (``jobs``), the
steps that reached the server, the intervals.

Present time is the time a worker was there and taking part: compute, exposed
communication, idle (``schema.PRESENT_KINDS``). A worker left out of a sampled round
(``not drawn``: free and there when the round was drawn, not drawn in it) waited for
nobody and nobody for it: that time is not present time, so it is in none of the four
shares (which still add up to 1); ``not_drawn`` gives it apart, as a share of the time the
workers were there (present + not drawn). A store written before the kind existed counts
such time as idle, as it did then. The bound still counts a not-drawn worker as able to
work: the fleet could have used it, the run chose not to.

A worker's unavoidable round trip is one download and one upload of its first job's
bytes over its own link (latency + bytes / bandwidth each way, as the simulator times a
star's transfers). For an all-reduce or region servers the bound keeps that star's
round trip: still a lower bound on what a worker must move, if a loose one. A worker
away (absent or offline: the ``intervals`` say when) adds nothing meanwhile.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from fedlm.sim.bound import goodput, least_time
from fedlm.sim.links import transfer_seconds
from fedlm.store.connection import connect_readonly
from fedlm.store.schema import EXPOSED_COMM_KINDS, PRESENT_KINDS, IntervalKind

AWAY_KINDS = (IntervalKind.ABSENT.value, IntervalKind.OFFLINE.value)  # not there: no work


@dataclass(frozen=True)
class Yardstick:
    steps: int  # inner steps that reached the server
    bound: float  # the least virtual time its fleet needs for them (s)
    time: float  # the run's own virtual time (s)
    goodput: float  # useful compute over present worker time
    # the rest of present worker time, as shares of it (with goodput they add up to 1):
    unapplied: float  # compute whose update was never applied (lost, dropped, cut)
    communication: float  # transfers and exchanges the worker waited for
    idle: float  # waiting for work (a barrier, a quorum, an empty slot)
    # left out of sampled rounds: a share of the time there (present + not drawn), apart
    not_drawn: float = 0.0

    @property
    def ratio(self) -> float | None:
        """The run's time over the bound (None: no bound to compare with)."""
        return self.time / self.bound if self.bound > 0 else None


def yardstick(path: str | Path, run_id: int) -> Yardstick:
    with closing(connect_readonly(path)) as conn:
        workers = conn.execute("SELECT worker, step_time, latency, down_bw, up_bw FROM workers "
                               "WHERE run_id=? ORDER BY worker", (run_id,)).fetchall()
        moved = {w: (d, u) for w, d, u in conn.execute(
            "SELECT worker, down_bytes, up_bytes FROM jobs WHERE run_id=? AND down_bytes IS NOT "
            "NULL ORDER BY job_id DESC", (run_id,))}  # each worker's first job's, last written
        steps, = conn.execute("SELECT COALESCE(SUM(local_steps), 0) FROM updates WHERE "
                              "run_id=?", (run_id,)).fetchone()
        end, = conn.execute("SELECT COALESCE(virtual_time, 0) FROM runs WHERE id=?",
                            (run_id,)).fetchone()
        spent = dict(conn.execute("SELECT kind, SUM(t_end - t_start) FROM intervals WHERE "
                                  "run_id=? GROUP BY kind", (run_id,)).fetchall())
        away = {w: [] for w, *_ in workers}  # worker -> spans it was not there
        for w, start, end in conn.execute(f"SELECT worker, t_start, t_end FROM intervals "
                                          f"WHERE run_id=? AND kind IN "
                                          f"({','.join('?' * len(AWAY_KINDS))})",
                                          (run_id, *AWAY_KINDS)):
            away.setdefault(w, []).append((start, end))
        useful, = conn.execute("SELECT COALESCE(SUM(i.t_end - i.t_start), 0) FROM intervals i "
                               "JOIN updates u ON u.run_id = i.run_id AND u.job_id = i.job_id "
                               "WHERE i.run_id=? AND i.kind='compute' AND u.applied_version "
                               "IS NOT NULL", (run_id,)).fetchone()
    if not workers:
        return Yardstick(steps, 0.0, end, *_shares(spent, useful))
    typical = next(iter(moved.values()), (0, 0))
    trips = [transfer_seconds(moved.get(w, typical)[0] or 0, down, lat)
             + transfer_seconds(moved.get(w, typical)[1] or 0, up, lat)
             for w, _, lat, down, up in workers]
    bound = least_time([t for _, t, *_ in workers], trips, steps,
                       [away[w] for w, *_ in workers])
    return Yardstick(steps, bound, end, *_shares(spent, useful))


def _shares(spent: dict[str, float], useful: float
            ) -> tuple[float, float, float, float, float]:
    """Goodput, unapplied compute, communication and idle: shares of present time; and
    not drawn, a share of present and not-drawn time together."""
    present = sum(spent.get(k, 0.0) for k in PRESENT_KINDS)

    def share(seconds: float) -> float:
        return goodput(seconds, present)

    left_out = spent.get(IntervalKind.NOT_DRAWN.value, 0.0)
    return (share(useful), share(spent.get(IntervalKind.COMPUTE.value, 0.0) - useful),
            share(sum(spent.get(k, 0.0) for k in EXPOSED_COMM_KINDS)),
            share(spent.get(IntervalKind.IDLE.value, 0.0)),
            left_out / (present + left_out) if left_out > 0 else 0.0)
