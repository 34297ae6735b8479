"""Replies as they come in from the transport, until the engine takes them.

Replies arrive in any order (Ray, real nodes); the event source decides when
each is handed on (``wait_for`` a given job on the virtual clock, the first to
arrive on the wall clock). A reply for a job the engine no longer waits for (it
missed its deadline, or arrived twice) is logged and dropped; ``settled`` keeps
the recently finished jobs to tell the two apart.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

from fedlm.engine.in_flight import InFlightJobs
from fedlm.engine.runlog import RunLog
from fedlm.engine.types import Interrupted, JobResult, Transport


class Inbox:
    def __init__(self, transport: Transport, flights: InFlightJobs, log: RunLog, *,
                 should_stop: Callable[[], bool], reply_timeout: float, recent: int) -> None:
        self.transport = transport
        self.flights = flights  # the jobs in flight (read only)
        self.log = log
        self.should_stop = should_stop
        self.reply_timeout = reply_timeout
        self.recent = recent  # finished jobs remembered, to classify late replies
        self.arrived: dict[int, JobResult] = {}  # in arrival order (dicts keep insertion order)
        self.settled: OrderedDict[int, str] = OrderedDict()  # recent finished job -> done | lost

    def receive(self, timeout: float, *, now: float) -> None:
        """Take what the transport has (waiting up to ``timeout`` s for something);
        ``now``: the run's time, for the log of replies no longer waited for."""
        if self.should_stop():
            raise Interrupted("interrupted")  # the engine says at which version
        for reply in self.transport.collect(timeout=timeout):
            if reply.job_id in self.flights and reply.job_id not in self.arrived:
                self.arrived[reply.job_id] = reply
            else:
                self.ignore(reply, "duplicate_reply" if reply.job_id in self.arrived
                            or self.settled.get(reply.job_id) == "done" else "late_reply",
                            now=now)

    def wait_for(self, job_id: int, *, now: float) -> JobResult:
        """Block until the reply of ``job_id`` has arrived; keep the others for later."""
        deadline = time.monotonic() + self.reply_timeout
        while job_id not in self.arrived:
            left = deadline - time.monotonic()
            if left <= 0:
                return JobResult(job_id, None, error=f"no reply within {self.reply_timeout} s",
                             wall_arrival=time.time())
            self.receive(min(left, 1.0), now=now)
        return self.arrived.pop(job_id)

    def first(self) -> tuple[int, JobResult] | None:
        """The earliest arrival not yet handed on, if any."""
        if not self.arrived:
            return None
        job_id = next(iter(self.arrived))
        return job_id, self.arrived.pop(job_id)

    def ignore(self, reply: JobResult, kind: str, *, now: float) -> None:
        self.log.ignored(reply, kind, now)

    def settle(self, job_id: int, how: str) -> None:
        self.settled[job_id] = how
        if len(self.settled) > self.recent:  # only recent ones get late replies
            # O(1); a plain dict's first key takes a walk past every slot removed before
            self.settled.popitem(last=False)

    def state_dict(self) -> dict:
        return {"settled": dict(self.settled)}

    def load_state_dict(self, state: dict) -> None:
        self.settled = OrderedDict(state["settled"])
