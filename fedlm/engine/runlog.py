"""The run log: every row the engine writes to the run store goes through here.

It also numbers the operations (``op``): each dispatch, each update handed to
the strategy, each lost job and each arrival of a message between servers
gets the next number, which is the order
``fedlm replay`` walks. With no writer (tests, benchmarks) it only counts.
"""

from __future__ import annotations

import json
from typing import Iterable

from fedlm.params import update_digest
from fedlm.store import IntervalKind, RunWriter
from fedlm.store.rounds import ROUND_DRAWN  # an event: whom a round was drawn from
from fedlm.store.schema import TIMER_EVENT  # an operation: a kind's wake-up rang
from fedlm.job import JobSpec

from fedlm.engine.types import JobResult

# (worker, kind, start, end, model version, job id or None)
IntervalRow = tuple[int, IntervalKind, float, float, int, int | None]


class RunLog:
    def __init__(self, writer: RunWriter | None) -> None:
        self.writer = writer
        self.op = 0  # the next operation's number

    def _next_op(self) -> int:
        self.op += 1
        return self.op - 1

    def _event(self, kind: str, now: float, **fields) -> None:
        if self.writer:
            self.writer.add_event(kind=kind, virtual_time=now, **fields)

    def rang(self, row: dict) -> None:
        """A wake-up the server kind asked for rang (``key``, ``t_set``, ``t_due``) and
        the kind took it: an operation, replayed in this order."""
        self._event(TIMER_EVENT, row["t_due"], detail=json.dumps({"op": self._next_op(), **row}))

    def intervals(self, rows: Iterable[IntervalRow]) -> None:
        if self.writer:
            self.writer.add_intervals(rows)

    # -- jobs ---------------------------------------------------------------
    def dispatched(self, job: JobSpec, now: float, *, down_bytes: int, up_bytes: int) -> None:
        op = self._next_op()
        if self.writer:
            self.writer.add_job(job, op=op, t_dispatch=now, down_bytes=down_bytes,
                                up_bytes=up_bytes)
        if job.fault:
            self._event("fault_injected", now, worker=job.worker, job_id=job.job_id,
                        detail=job.fault)

    def updated(self, row: dict, outer_grad) -> None:
        """A finished job's update, handed to the strategy (``row``: the updates
        table's columns but ``op`` and the update's hash)."""
        op = self._next_op()
        if self.writer:
            self.writer.add_update({**row, "op": op, "update_hash": update_digest(outer_grad)})
            self.writer.end_job(row["job_id"], status="done", op=op)

    def lost(self, job: JobSpec, now: float, *, error: str, reason: str,
             failures: int) -> None:
        self._event("job_failed", now, worker=job.worker, job_id=job.job_id, detail=error)
        op = self._next_op()
        if self.writer:
            self.writer.end_job(job.job_id, status="lost", op=op, computed=False,
                                reason=reason)
        if reason == "retired":
            self._event("worker_retired", now, worker=job.worker,
                        detail=f"{failures} failures in a row")

    def cancelled(self, job_ids: list[int], why: str) -> None:
        """Jobs in flight when the run ended: never handed on, so no op of their own."""
        if self.writer and job_ids:
            self.writer.cancel_jobs(job_ids, reason=why)

    def ignored(self, reply: JobResult, kind: str, now: float) -> None:
        """A reply for a job no longer waited for (``late_reply``, ``duplicate_reply``)."""
        self._event(kind, now, job_id=reply.job_id,
                    detail="ignored" + (f" ({reply.error})" if reply.error else ""))

    def transferred(self, row: dict) -> None:
        """A message between servers arrived (the transfers table's columns but
        ``op``): an operation, replayed in this order."""
        op = self._next_op()
        if self.writer:
            self.writer.add_transfer({**row, "op": op})

    # -- versions -------------------------------------------------------------
    def round_closed(self, now: float, version: int, updates: int) -> None:
        self._event("round_closed", now,
                    detail=f"version {version} from {updates} updates after a lost job")

    def round_drawn(self, now: float, offered: list[int]) -> None:
        """A strategy drew its round from ``offered``: replay offers them again before
        the op numbered now (the round's first dispatch)."""
        self._event(ROUND_DRAWN, now, detail=json.dumps({"op": self.op, "offered": offered}))

    def applied(self, version: int, seqs: list[int]) -> None:
        if self.writer:
            self.writer.mark_applied(version, seqs)

    def grace_closed(self, now: float, *, waited: float, late: list[int]) -> None:
        """An adaptive grace window closed without every job it waited for."""
        self._event("grace_timeout", now,
                    detail=f"waited {waited:.1f} s; jobs {', '.join(map(str, late))} not in yet")

    def metric(self, **row) -> None:
        if self.writer:
            self.writer.add_metric(**row)
            self.writer.commit()

    def diverged(self, now: float, why: str) -> None:
        self._event("diverged", now, detail=why)

    def stalled(self, now: float, why: str) -> None:
        self._event("stalled", now, detail=why)

    def checkpoint(self, now: float, version: int) -> None:
        self._event("checkpoint", now, detail=f"version {version}, op {self.op}")

    # -- workers --------------------------------------------------------------
    def offline(self, worker: int, now: float, seconds: float) -> None:
        self._event("worker_offline", now, worker=worker, detail=f"for {seconds:g} s")

    def online(self, worker: int, now: float, since: float, version: int,
               absent: bool = False) -> None:
        kind = IntervalKind.ABSENT if absent else IntervalKind.OFFLINE
        self.intervals([(worker, kind, since, now, version, None)])
        self._event("worker_online", now, worker=worker,
                    detail=f"after {now - since:.1f} s {kind.value}")

    # a fleet that changes over time (fedlm.sim.dynamics)
    def absent(self, worker: int, since: float, until: float) -> None:
        detail = "left for good" if until == float("inf") else f"until {until:.1f} s"
        self._event("worker_absent", since, worker=worker, detail=detail)

    def straggler(self, worker: int, now: float, multiplier: float) -> None:
        self._event("straggler", now, worker=worker, detail=f"compute x{multiplier:.2f}")

    def fleet_empty(self, now: float, gone: int) -> None:
        self._event("fleet_empty", now, detail=f"no worker left to train ({gone} gone for good)")

    def commit(self, force: bool = True) -> None:
        if self.writer:
            self.writer.commit(force=force)

    def state_dict(self) -> dict:
        return {"op": self.op}

    def load_state_dict(self, state: dict) -> None:
        self.op = state["op"]
