"""Where the engine's events come from, in which order: two sources, one interface.

- ``VirtualEvents`` (simulation): a job's duration is known when it is
  dispatched (download + compute + upload from the worker's profile, or moved
  along a shared server link by ``fedlm.sim.network``), so its completion goes on a
  virtual clock, and finished jobs are handed on in virtual-completion order,
  whatever order their real replies arrive in. A simulated run is then a pure
  function of its config and seed.
- ``WallEvents`` (real nodes): jobs are handed on in real arrival order, times
  come from the wall clock, and deadlines and offline periods are checked
  against it.

Both give the loop ``JobDone`` and ``BackOnline`` events through
``next_event()``, and say how a finished job's time splits into download,
compute and upload (``spans``).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from fedlm.config import Config
from fedlm.sim.clock import VirtualClock
from fedlm.sim.dynamics import FleetDynamics
from fedlm.sim.fleet import JobTimer, JobTiming, WorkerProfile
from fedlm.sim.links import transfer_seconds
from fedlm.sim.network import Network
from fedlm.store import IntervalKind

from fedlm.engine.in_flight import InFlightJobs
from fedlm.engine.inbox import Inbox
from fedlm.engine.types import (BackOnline, Delivery, Event, InFlight, JobDone, Wake, departed,
                                missed_deadline)
from fedlm.engine.workers import WorkerPool

Span = tuple[IntervalKind, float, float]


# What the virtual clock holds besides BackOnline: a job's end (its completion,
# or its deadline if it will miss it) and, with a shared network, the steps a
# job's transfers take through it.
@dataclass(frozen=True)
class _JobEnds:
    job_id: int


@dataclass(frozen=True)
class _LinkChange:
    token: int  # the network's state when scheduled (stale if it changed since)


@dataclass(frozen=True)
class _Computed:
    job_id: int  # its upload joins the shared link


@dataclass(frozen=True)
class _Uploaded:
    job_id: int  # its upload has arrived


@dataclass(frozen=True)
class _Deadline:
    job_id: int


class VirtualEvents:
    lookahead = True  # the next event's time is known in advance

    def __init__(self, cfg: Config, fleet: list[WorkerProfile], flights: InFlightJobs,
                 inbox: Inbox, dynamics: FleetDynamics | None = None) -> None:
        self.fleet = fleet
        self.flights = flights
        self.inbox = inbox
        self.clock: VirtualClock = VirtualClock()
        # ``dynamics``: a fleet that changes over time (None: it does not)
        self.timer = JobTimer(fleet, cfg.seed, cfg.network.intra_bw, cfg.network.topology,
                              dynamics)
        n = cfg.network
        self.net = (Network(n.server_down, n.server_up, n.daily_amplitude, n.peak_hour)
                    if n.server_down or n.server_up or n.daily_amplitude else None)
        self.phases: dict[int, list[float]] = {}  # shared network: a job's phase end times
        self.down_bytes = self.up_bytes = 0  # what each job moves each way

    def set_payload(self, down_bytes: int, up_bytes: int) -> None:
        self.down_bytes, self.up_bytes = down_bytes, up_bytes

    @property
    def now(self) -> float:
        return self.clock.now

    def next_time(self) -> float | None:
        nxt = self.clock.peek()
        return None if nxt is None else nxt[0]

    def timing(self, w: int, steps: int, index: int = 0,
               up_bytes: int | None = None) -> JobTiming:
        """The durations of ``w``'s ``index``-th job, drawn now (the worker's jitter)."""
        down, up = self.down_bytes, self.up_bytes if up_bytes is None else up_bytes
        timing = self.timer.timing(w, steps, down, up, start=self.now, index=index)
        if self.net is not None:  # nominal transfer times at this hour's bandwidth
            region = self.fleet[w].region
            m = self.net.factor(self.now)
            timing = JobTiming(transfer_seconds(down, region.down_bw * m, region.latency),
                               timing.compute,
                               transfer_seconds(up, region.up_bw * m, region.latency))
        return timing

    def overlapped_timing(self, w: int, steps: int, down_bytes: int, up_bytes: int,
                          overlap: int) -> JobTiming:
        """A job that waits for the previous round's exchange, overlapped by its first
        ``overlap`` steps (``JobTimer.overlapped_timing``; no shared link)."""
        return self.timer.overlapped_timing(w, steps, self.down_bytes, down_bytes, up_bytes,
                                            overlap)

    def transfer_times(self, down_bytes: int, up_bytes: list[int]) -> list[float]:
        """Each worker's nominal seconds of transfers per whole-model job (link model):
        ``down_bytes`` down, its own ``up_bytes[w]`` up."""
        return [self.timer.transfers(w, down_bytes, up) for w, up in enumerate(up_bytes)]

    def will_expire(self, timing: JobTiming, fault: str, limit: float) -> bool:
        """Whether the job misses its deadline (known at dispatch, without a shared link)."""
        return self.net is None and (fault == "hang" or self.now + timing.total > limit)

    def dispatched(self, f: InFlight) -> None:
        now = self.now
        job_id = f.job.job_id
        if self.net is not None:  # the job's download joins the shared link
            self.net.add(now, (job_id, "down"), "down", self.down_bytes,
                         self.fleet[f.job.worker].region.down_bw)
            self.phases[job_id] = [now]
            self.clock.schedule(f.deadline, _Deadline(job_id))
            self._schedule_network()
        else:
            end = f.deadline if f.expires else now + f.timing.total
            self.clock.schedule(end if f.departs is None else min(end, f.departs),
                                _JobEnds(job_id))

    def went_offline(self, w: int, until: float) -> None:
        self.clock.schedule(until, BackOnline(w))

    def deliver_at(self, at: float, key: int) -> None:
        """A message between servers (``key``) arrives at ``at``."""
        self.clock.schedule(at, Delivery(key))

    def wake_at(self, at: float, key: int) -> None:
        """The server kind's wake-up ``key`` is due at ``at``."""
        self.clock.schedule(at, Wake(key))

    def next_event(self, until: float | None = None, advance: bool = True) -> Event | None:
        """The next event; with ``until``, None if nothing happens by then (the clock
        then moves on to ``until``, unless ``advance`` is False)."""
        while True:
            nxt = self.clock.peek()
            if until is not None and (nxt is None or nxt[0] > until):
                if advance and until > self.clock.now:
                    self.clock.advance(until)
                return None
            _, event = self.clock.pop()
            if isinstance(event, (BackOnline, Delivery, Wake)):
                return event
            if isinstance(event, _JobEnds):
                reply = self.inbox.wait_for(event.job_id, now=self.now)
                f = self.flights[event.job_id]
                if f.departs is not None and self.now >= f.departs:  # it went away
                    self.inbox.ignore(reply, "late_reply", now=self.now)
                    reply = departed(event.job_id, f, time.time())
                elif f.expires:  # what came back came too late
                    self.inbox.ignore(reply, "late_reply", now=self.now)
                    reply = missed_deadline(event.job_id, f, time.time())
                return JobDone(event.job_id, reply)
            done = self._network_event(event)
            if done is not None:
                return done

    # -- the shared network -------------------------------------------------------
    def _schedule_network(self) -> None:
        """Put the network's next change on the clock (older such events go stale)."""
        t = self.net.next_finish()
        if t is not None:
            self.clock.schedule(max(t, self.clock.now), _LinkChange(self.net.token))

    def _network_event(self, event) -> JobDone | None:
        """Move a job along download -> compute -> upload; return what the loop
        must handle (a finished or expired job), or None."""
        now = self.clock.now
        if isinstance(event, _LinkChange):
            if event.token != self.net.token:
                return None  # the flows changed since this was scheduled
            for job_id, phase in self.net.advance(now):
                f = self.flights[job_id]
                latency = self.fleet[f.job.worker].region.latency
                self.phases[job_id].append(now + latency)
                if phase == "up":
                    self.clock.schedule(now + latency, _Uploaded(job_id))
                elif f.job.fault != "hang":  # a hung worker never computes nor replies
                    self.clock.schedule(now + latency + f.timing.compute, _Computed(job_id))
            self._schedule_network()
            return None
        key = event.job_id
        if key not in self.flights:
            return None
        if isinstance(event, _Computed):
            self.phases[key].append(now)
            self.net.add(now, (key, "up"), "up", self.up_bytes,
                         self.fleet[self.flights[key].job.worker].region.up_bw)
            self._schedule_network()
            return None
        if isinstance(event, _Uploaded):
            return JobDone(key, self.inbox.wait_for(key, now=now))
        # _Deadline: whatever it still sends is too late
        self.net.remove(now, (key, "down"))
        self.net.remove(now, (key, "up"))
        self._schedule_network()
        self.inbox.ignore(self.inbox.wait_for(key, now=now), "late_reply", now=now)
        return JobDone(key, missed_deadline(key, self.flights[key], time.time()))

    def spans(self, f: InFlight, end: float, compute_seconds: float) -> list[Span]:
        """download / compute / upload (and waits on the shared link) of a job."""
        t0 = f.t_dispatch
        if f.job.job_id in self.phases:  # shared network: what took longer than the
            # job's own link alone would have was waiting on the shared link
            ph = self.phases.pop(f.job.job_id)[1:]
            down, comp = (ph + [end, end])[:2]
            up = ph[2] if len(ph) > 2 else end
            return [(IntervalKind.DOWNLOAD, t0, t0 + f.timing.download),
                    (IntervalKind.LINK_WAIT, t0 + f.timing.download, down),
                    (IntervalKind.COMPUTE, down, comp),
                    (IntervalKind.UPLOAD, comp, comp + f.timing.upload),
                    (IntervalKind.LINK_WAIT, comp + f.timing.upload, up)]
        a = t0 + f.timing.download
        if f.timing.exchange or f.timing.hidden:  # an all-reduce, or an overlapped exchange
            return _exchange_spans(f.timing, a, end)
        b = a + f.timing.compute
        return [(IntervalKind.DOWNLOAD, t0, a), (IntervalKind.COMPUTE, a, b),
                (IntervalKind.UPLOAD, b, end)]

    def state_dict(self) -> dict:
        return {"clock": self.clock.state_dict(), "timer": self.timer.state_dict(),
                "network": self.net.state_dict() if self.net else None,
                "phases": {j: list(p) for j, p in self.phases.items()}}

    def load_state_dict(self, st: dict) -> None:
        self.clock.load_state_dict(st["clock"])
        self.timer.load_state_dict(st["timer"])
        if self.net is not None:
            self.net.load_state_dict(st["network"])
        self.phases = {j: list(p) for j, p in st["phases"].items()}


def _exchange_spans(timing: JobTiming, a: float, end: float) -> list[Span]:
    """compute (τ steps' worth) | exposed exchange | the rest of compute, with the
    hidden part of the exchange beside the first compute span (not counted in time
    totals: ``fedlm.store.schema.COUNTED_KINDS``). Without overlap (an all-reduce
    after the compute) the first span is the whole compute."""
    x = a + timing.before_exchange
    e = x + timing.exchange
    spans = [(IntervalKind.COMPUTE, a, x), (IntervalKind.EXCHANGE, x, e),
             (IntervalKind.COMPUTE, e, e + timing.compute - timing.before_exchange),
             (IntervalKind.HIDDEN, a, a + timing.hidden)]
    return [(kind, s, min(t, end)) for kind, s, t in spans if t > s]


class WallEvents:
    lookahead = False  # nothing is known before it happens

    def __init__(self, flights: InFlightJobs, inbox: Inbox, pool: WorkerPool) -> None:
        self.flights = flights
        self.inbox = inbox
        self.pool = pool
        self._start = time.monotonic()
        self.deliveries: list[tuple[float, int]] = []  # (when, key): transfers on their way
        self.wakes: list[tuple[float, int]] = []  # (when, key): the server kind's wake-ups

    @property
    def now(self) -> float:
        return time.monotonic() - self._start

    def next_time(self) -> None:
        return None

    def set_payload(self, down_bytes: int, up_bytes: int) -> None:
        pass

    def timing(self, w: int, steps: int, index: int = 0, up_bytes: int | None = None) -> None:
        return None  # real transfers and compute take what they take

    def overlapped_timing(self, w: int, steps: int, down_bytes: int, up_bytes: int,
                          overlap: int) -> None:
        return None

    def transfer_times(self, down_bytes: int, up_bytes: list[int]) -> None:
        return None  # learnt from the jobs (dylu-online), not known in advance

    def will_expire(self, timing, fault: str, limit: float) -> bool:
        return False  # a deadline is noticed when it passes

    def dispatched(self, f: InFlight) -> None:
        pass

    def went_offline(self, w: int, until: float) -> None:
        pass  # noticed when ``until`` has passed

    def deliver_at(self, at: float, key: int) -> None:
        """A transfer's simulated link time runs on the wall clock: it arrives at ``at``."""
        heapq.heappush(self.deliveries, (at, key))

    def wake_at(self, at: float, key: int) -> None:
        """The server kind's wake-up ``key`` is due at ``at`` on the wall clock."""
        heapq.heappush(self.wakes, (at, key))

    def next_event(self, until: float | None = None, advance: bool = True) -> Event | None:
        """The first of: a worker back online, a missed deadline, an arrival; with
        ``until``, None if none has happened by then."""
        while True:
            first = self.inbox.first()
            if first is not None:
                return JobDone(*first)
            now = self.now
            back = self.pool.due_online(now)
            if back:
                return BackOnline(min(back))
            if self.deliveries and self.deliveries[0][0] <= now:
                return Delivery(heapq.heappop(self.deliveries)[1])
            if self.wakes and self.wakes[0][0] <= now:
                return Wake(heapq.heappop(self.wakes)[1])
            j = self.flights.first_departed(now)
            if j is not None:
                return JobDone(j, departed(j, self.flights[j], time.time()))
            j = self.flights.first_overdue(now)
            if j is not None:
                return JobDone(j, missed_deadline(j, self.flights[j], time.time()))
            if until is not None and now >= until:
                return None
            times = (self.flights.next_deadline(), self.flights.next_departure(), until)
            soonest = min([t for t in times if t is not None]
                          + [u for _, u in self.pool.offline.values()]
                          + [at for at, _ in self.deliveries[:1] + self.wakes[:1]],
                          default=now + 1.0)
            self.inbox.receive(min(max(soonest - now, 0.0), 1.0), now=now)

    def spans(self, f: InFlight, end: float, compute_seconds: float) -> list[Span]:
        """The client reports its compute time; the rest of the wait was transfer."""
        a = max(f.t_dispatch, end - compute_seconds)
        return [(IntervalKind.DOWNLOAD, f.t_dispatch, a), (IntervalKind.COMPUTE, a, end),
                (IntervalKind.UPLOAD, end, end)]

    def state_dict(self) -> dict:
        return {"now": self.now, "deliveries": list(self.deliveries), "wakes": list(self.wakes)}

    def load_state_dict(self, st: dict) -> None:
        self._start = time.monotonic() - st["now"]  # go on from there
        self.deliveries = list(st.get("deliveries", []))
        self.wakes = list(st.get("wakes", []))  # an older checkpoint has none
