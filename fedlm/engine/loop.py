"""The engine: one loop for synchronous and asynchronous training.

    until the run is done:
        offer every free worker a job (the strategy says whether it gets one and
            from which model, the local-steps policy how many inner steps; the job's
            data shard, schedule position, fault and deadline are drawn here)
        take the next event: a finished job (its result, its error or its missed
            deadline), a worker back online, or a message between servers in
        a result is checked at the boundary (shapes, dtypes, NaN) and handed to the
            strategy; a new global version may follow (evaluated every eval.every
            versions, checkpointed every reliability.checkpoint_every)

Who owns what: the server (``fedlm.servers``, of the kind the config names, driven
through ``ServerCalls`` as replay drives it) the evaluated params, their version, the
strategy and what each job is sent; the ``WorkerPool`` the workers' lifecycle; the event source
(``VirtualEvents`` or ``WallEvents``) the order of events and the time; the ``Inbox``
the replies not yet handed on; ``InFlightJobs`` the jobs in flight; the ``RunLog``
every store write; the ``JobMaker`` what each new job is; ``Presence`` who is there on
a fleet that changes over time; ``ServerTransfers`` the timing of messages between
servers. The loop owns the totals; its scan of free workers is ``Offering``'s, its
evaluations and the stops of a run that diverged or stalled ``Health``'s.

A dispatched job goes to a ``Transport`` (Flower's Grid in ``server_app``; an
in-process trainer in tests, sweeps and replay) and computes while the loop goes on.
Each job names the worker state it starts from (the worker's last *accepted* job),
so a lost job leaves no trace on the worker either. Checkpoints are taken at the top
of the loop (``state_dict``); ``run(..., resume=state)`` re-sends the jobs in flight.
"""

from __future__ import annotations

import time
from typing import Callable

from fedlm.config import Config
from fedlm import servers
from fedlm.sim import dynamics, faults, link_codecs
from fedlm.sim.fleet import WorkerProfile
from fedlm.store import RunWriter
from fedlm.engine import state, timeline
from fedlm.engine.budget import StepBudget
from fedlm.engine.divergence import DivergenceWatch, hint
from fedlm.engine.events import VirtualEvents, WallEvents
from fedlm.engine.grace import grace_for, late_jobs, window_events
from fedlm.engine.health import Health
from fedlm.engine.in_flight import InFlightJobs
from fedlm.engine.inbox import Inbox
from fedlm.engine.jobs import JobMaker
from fedlm.engine.offering import Offering
from fedlm.engine.presence import Presence
from fedlm.engine.replies import outcome, ran_out_of_memory
from fedlm.engine.runlog import RunLog
from fedlm.engine.stall import StallWatch
from fedlm.engine.timers import ServerTimers
from fedlm.engine.transfers import ServerTransfers
from fedlm.engine.types import (BackOnline, Delivery, EngineError, Event, InFlight, Wake,
                                Interrupted, Progress, JobResult, Transport)
from fedlm.engine.workers import WorkerPool


class Engine(Offering, Health):
    """Made in one place, ``fedlm.engine.assembly.assemble``, from a config and the server
    kind built for it (with its strategy and its local-steps policy)."""

    def __init__(self, cfg: Config, *, server: servers.Server, transport: Transport,
                 fleet: list[WorkerProfile], writer: RunWriter | None,
                 evaluate: Callable | None = None,
                 progress: Callable[[Progress], None] | None = None,
                 should_stop: Callable[[], bool] | None = None,
                 checkpoint: Callable[[dict], None] | None = None,
                 shard_sizes: list[int] | None = None) -> None:
        kind = server
        self.hook_watch = servers.HookWatch(cfg.reliability.hook_timeout)
        self.server = servers.ServerCalls(kind, on_version=self._new_version,
                                          on_messages=lambda m: self.transfers.send(m, self.now),
                                          on_alarms=lambda a: self.timers.set(a, self.now),
                                          watch=self.hook_watch)
        servers_fleet = fleet  # as configured: messages between servers are timed on it
        # the links a worker's jobs take: to its server (which may sit in its region)
        fleet = self.server.links(servers_fleet)
        self.cfg = cfg
        self.fleet = fleet
        # the kind's policy sizes jobs: the engine starts it and tells it what jobs took
        self.policy = self.server.policy
        self.evaluate = evaluate
        self.progress = progress
        self.checkpoint = checkpoint  # called with state_dict() every checkpoint_every versions
        self.transport = (faults.DuplicatingTransport(transport) if cfg.faults.duplicate > 0
                          else transport)
        self.log = RunLog(writer)
        self.pool = WorkerPool(cfg, len(fleet))
        self.in_flight = InFlightJobs()
        self.inbox = Inbox(self.transport, self.in_flight, self.log,
                           should_stop=should_stop or (lambda: False),
                           reply_timeout=cfg.sim.reply_timeout, recent=4 * len(fleet) + 64)
        # a fleet that changes over time, or None (fedlm.sim.dynamics)
        changes = dynamics.build(cfg.fleet, [p.region.name for p in fleet], cfg.seed)
        # cfg.clock: results in virtual-completion order, or in real arrival order
        self.events = (VirtualEvents(cfg, fleet, self.in_flight, self.inbox, changes)
                       if cfg.clock == "virtual" else WallEvents(self.in_flight, self.inbox, self.pool))
        self.presence = (Presence(changes, self.pool, self.events, self.log, self.policy)
                         if changes is not None else None)
        self.jobs = JobMaker(cfg, fleet, shard_sizes)
        self.budget = StepBudget(cfg.local_step_budget, self.server.synchronous)
        self.transfers = ServerTransfers(cfg, servers_fleet, self.events, self.log)
        self.timers = ServerTimers(self.events, self.log)
        # updates and eval.every count outer steps (a server may make several versions in one)
        self.versions_wanted = self.server.versions_wanted(cfg.updates)
        self.grace = grace_for(cfg, self.server, self.policy, fleet)  # again once DyLU knows links
        self.base_params: dict[int, object] = {}  # versions in-flight jobs started from
        self.tokens = self.steps_done = self.jobs_done = 0
        self.last_perplexity: float | None = None
        self.last_eval_version = -1  # the version evaluated last
        self._checkpoint_due = False
        self.wall_start = time.time()
        # the best validation loss so far; a resumed run's is seeded from its evaluations
        self.divergence = DivergenceWatch(cfg.eval.diverge_factor,
                                          hint(self.server.strategy_name, self.server.outer_lr))
        self.stall = StallWatch(len(fleet))  # a run that can make no progress stops
        self._cancelled = False  # the jobs in flight at the end are marked cancelled once

    @property
    def now(self) -> float:
        """Seconds since the start: virtual, or real on the wall clock."""
        return self.events.now

    @property
    def version(self) -> int:
        return self.server.evaluated()[0]

    @property
    def params(self):
        return self.server.evaluated()[1]

    def done(self) -> bool:
        """Stop at ``updates`` versions, at the time budget, or once the local-step
        budget is spent (``StepBudget.over``)."""
        held = self.transfers.flying and self.server.drains_messages()  # updates on the wire
        return (self.version >= self.versions_wanted
                or self.budget.over(self.steps_done, bool(self.in_flight or held))
                or 0 < self.cfg.time_budget <= self.now)

    # -- the loop -------------------------------------------------------------
    def run(self, params, resume: dict | None = None):
        """Train until ``cfg.updates`` global versions exist (or a budget is spent,
        see ``done``; updates then held in a buffer are not applied); return the
        final params. ``resume``: a ``state_dict()`` to continue from."""
        try:
            with self.hook_watch.armed():
                return self._run(params, resume)
        except Interrupted:  # the inbox saw the stop signal while it waited
            raise Interrupted(f"interrupted at version {self.version}") from None

    def _run(self, params, resume: dict | None):
        down, up, uploads = self.server.start(params, self.fleet)  # a whole job's bytes
        # DyLU and fill size whole jobs, transfers too: each at its own link's upload
        transfers = self.events.transfer_times(down, uploads)
        self.policy.start(steps=self.cfg.inner.steps, transfer_times=transfers,
                          step_times=[p.step_time for p in self.fleet])
        self.grace = grace_for(self.cfg, self.server, self.policy, self.fleet)
        if resume is None:
            self.model_bytes, self.up_bytes = down, up
            self.events.set_payload(self.model_bytes, self.up_bytes)
            self.pool.start(now=0.0)
            self._evaluate()
        else:
            self.load_state_dict(resume)
            state.resubmit(self)  # the jobs the dead process was waiting for
        while True:
            if self._checkpoint_due:
                self._write_checkpoint()
            if self.done():
                break
            self._dispatch_free_workers()
            if self.presence is not None and self.presence.everyone_left(self.in_flight):
                break
            if self.stall.stuck(self.in_flight, self.pool.offline, self.events,
                                self.transfers.flying or self.timers.pending):
                raise EngineError(f"stalled at version {self.version}: no job in flight "
                                  f"and strategy {self.server.strategy_name!r} gives none to "
                                  f"the {len(self.pool.free_since)} free workers")
            first = self._handle(self.events.next_event())
            self._check_progress()
            nxt = self.events.next_time()
            if self.cfg.time_budget and nxt is not None and nxt > self.cfg.time_budget:
                break  # the next job would finish after the time budget
            if first is not None:
                self._take_window(self.grace.open(self.now, first, self.in_flight))
        if self.last_eval_version != self.version:
            self._evaluate()
        self._close_timeline()
        return self.params

    def _dispatch(self, w: int, now: float, steps: int) -> None:
        waited = self.pool.free_kind(w)  # idle, or not drawn in a round it now is drawn in
        index, free_since = self.pool.take(w)
        job = self.jobs.make(w, version=self.version, steps=steps, index=index,
                             prev_job=self.pool.state_job[w], keep_from=self.pool.keep_from(w))
        sent = self.server.dispatch(job, self.events, index)
        job, payload, timing = sent.job, sent.payload, sent.timing
        limit = now + self.jobs.time_allowed(job, timing)
        expires = timing is not None and self.events.will_expire(timing, job.fault, limit)
        flight = InFlight(job, now, timing, index, limit, expires, sent.keep,
                          self.presence and self.presence.departure(w, index, now, timing))
        self.log.intervals([(w, waited, free_since, now, self.version, None)])
        self.in_flight.add(flight)
        self.grace.dispatched(flight)
        if self.checkpoint is not None:  # a checkpoint must be able to re-send it
            self.base_params.setdefault(self.version, self.params)
        self.events.dispatched(flight)
        self.log.dispatched(job, now, down_bytes=sent.down, up_bytes=sent.up)
        self.transport.submit(job, payload)

    def _take_window(self, window) -> None:
        """Take the finished jobs that belong with the one just taken (the grace window,
        ``fedlm.engine.grace``) before any worker gets new work."""
        if window is None:
            return
        for event in window_events(window, self.events, self.in_flight, self.done):
            self._handle(event)
        late = late_jobs(window, self.in_flight)
        if late is not None:
            self.log.grace_closed(self.now, waited=self.now - window.opened, late=late)

    def _handle(self, event: Event) -> InFlight | None:
        """Act on an event; a finished job (done or lost) is returned."""
        if isinstance(event, BackOnline):
            since, absent = self.pool.back_online(event.worker, self.now)
            self.log.online(event.worker, self.now, since, self.version, absent=absent)
            if absent:  # the fleet's dynamics brought it back (not a fault's time offline)
                self.policy.presence(event.worker, at=self.now, here=True)
            return None
        if isinstance(event, Delivery):
            staleness = self.server.arrived(event.key)  # a version, messages it sends on
            self.transfers.arrived(event.key, staleness, self.version)
            return None
        if isinstance(event, Wake):
            self.stall.rang(busy=bool(self.in_flight), now=self.now)
            self.server.rang(event.key)  # a version, messages, wake-ups it asks for
            self.timers.rang(event.key)
            return None
        return self._finished(event.job_id, event.reply)

    def _finished(self, job_id: int, reply: JobResult) -> InFlight:
        flight = self.in_flight.pop(job_id)
        job = flight.job
        w = job.worker
        now = self.now
        self.log.intervals(timeline.job_rows(self.events, flight, now, reply.compute_seconds))
        grad, error, reason = outcome(reply, self.server.reference(job),
                                      link_codecs.network_of(self.cfg.network, job))
        if error is not None:
            self._lost(flight, error, reason)
            self._suspect_model(job, reason)
            return flight
        self.pool.accepted(w, job_id)
        self.stall.update_accepted()
        self.grace.observe(flight, now)
        self.inbox.settle(job_id, "done")
        self._release(w, flight.index)
        self.server.finished(job, grad, reply.tokens, reply.steps,  # a version may follow
                             record=lambda u, seq: self._updated(flight, reply, u, seq))
        self.log.commit(force=False)
        self._report()
        return flight

    def _updated(self, flight: InFlight, reply: JobResult, update, seq: int) -> None:
        """A finished job's update, numbered ``seq``, before the strategy takes it."""
        job = flight.job
        now = self.now
        self.tokens += reply.tokens
        self.steps_done += reply.steps
        self.jobs_done += 1
        self.log.updated({
            "seq": seq, "job_id": job.job_id, "worker": job.worker,
            "base_version": job.base_version, "received_version": self.version,
            "staleness": update.staleness, "local_steps": reply.steps,
            "data_seed": job.data_seed, "tokens": reply.tokens,
            "train_loss": reply.train_loss, "t_dispatch": flight.t_dispatch, "t_done": now,
            "wall_arrival": reply.wall_arrival, "compute_seconds": reply.compute_seconds},
            update.outer_grad)
        compute = flight.timing.compute if flight.timing is not None else reply.compute_seconds
        self.policy.observe(job.worker, steps=reply.steps, seconds=compute,
                            transfer=max(0.0, now - flight.t_dispatch - compute))

    def _lost(self, flight: InFlight, error: str, reason: str) -> None:
        job = flight.job
        w = job.worker
        if reason != "departed" and self.pool.failed(w) and reason != "memory":
            reason = "retired"
        self.inbox.settle(job.job_id, "lost")
        self.stall.job_lost(reason)
        self.log.lost(job, self.now, error=error, reason=reason,
                      failures=self.pool.failures[w])
        if reason == "memory":  # the same job sizes would run out again
            self.log.commit(force=True)
            raise ran_out_of_memory(job, error)
        if self.pool.everyone_retired():
            raise EngineError(f"every worker failed {self.cfg.reliability.max_failures} jobs "
                              f"in a row; last error: {error}")
        if reason == "departed":
            self.presence.departed(w, self.now)
        elif w not in self.pool.retired:
            self._release(w, flight.index)
        self.server.lost(w, job.job_id, reason)  # a version may follow (a round closing)
        self.log.commit(force=False)
        self._report()

    def _release(self, w: int, index: int) -> None:
        """A worker's job is over: it is free now, or goes offline for a while."""
        until = self.pool.release(w, index, self.now)
        if until is not None:
            self.events.went_offline(w, until)
            self.log.offline(w, self.now, self.cfg.faults.offline_seconds)

    def _new_version(self, version: servers.Version) -> None:
        """The server made a new version of the evaluated model (``ServerCalls``)."""
        if version.cause == "lost":  # e.g. a sync round closed with the replies it had
            self.log.round_closed(self.now, version.number, len(version.seqs))
        self.stall.new_version()
        if self.base_params:  # keep only versions that jobs still in flight started from
            used = self.in_flight.base_versions()
            self.base_params = {v: p for v, p in self.base_params.items() if v in used}
        self.log.applied(version.number, version.seqs)
        if version.number % (self.cfg.eval.every * self.server.versions_per_update()) == 0:
            self._evaluate()
        every = self.cfg.reliability.checkpoint_every
        if self.checkpoint is not None and every and version.number % every == 0:
            self._checkpoint_due = True

    def _write_checkpoint(self) -> None:
        self._checkpoint_due = False
        self.pool.pin(self.cfg.reliability.checkpoint_keep)
        self.log.checkpoint(self.now, self.version)  # logged first: undone on resume
        self.checkpoint(self.state_dict())

    def state_dict(self) -> dict:
        """Everything the loop needs to go on from here (at the top of the loop): each
        part's own state and the loop's totals (``fedlm.engine.state``)."""
        return state.capture(self)

    def load_state_dict(self, st: dict) -> None:
        state.restore(self, st)  # also a checkpoint written by an older fedlm

    def _close_timeline(self, why: str = "run finished") -> None:
        """Free workers were idle until now, offline ones offline; jobs in flight cancelled."""
        self.log.intervals(timeline.closing_rows(self.now, self.version, self.pool, self.presence,
                                                 self.in_flight, self.events, len(self.fleet)))
        self.cancel_in_flight(why)
        self.log.commit()

    def cancel_in_flight(self, why: str) -> None:
        """The jobs in flight at the end are marked ``cancelled``, once (replay walks only
        their dispatch)."""
        if not self._cancelled:
            self._cancelled = True
            self.log.cancelled(self.in_flight.ids(), why)

