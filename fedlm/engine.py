"""The engine: one loop for synchronous and asynchronous training.

Each time a worker is free the engine asks the strategy whether it gets a job
(sync: only when the round's barrier has passed; async: always) and the
local-steps policy how many inner steps. A dispatched job's virtual duration
is known at once from the worker's profile (download + compute + upload), so
its completion goes on the virtual clock while its real compute runs — in
parallel with every other outstanding job — behind a ``Transport`` (Flower's
Grid in ``server_app``; an in-process trainer in tests and replay).

Two orders in which finished jobs reach the strategy:

- ``virtual`` (simulation): virtual-completion order, never real arrival
  order. A simulated run is then a pure function of its config and seed,
  however Ray schedules the compute.
- ``wall`` (real nodes): real arrival order, times from the wall clock.

Either way every dispatch, update and lost job is written to the operation
log with a global operation number, so ``fedlm replay`` can re-execute the
run exactly (see ``fedlm.replay``).

Failures: every job has a deadline (virtual or real seconds); an error reply,
a rejected update (NaN, wrong shape/dtype/size: checked here, at the
boundary) or a missed deadline loses the job, the strategy hears
``on_job_lost`` (a sync round may then close with what arrived) and the worker
is free again — or offline for a while, or retired after too many failures in
a row. A late or duplicate reply is logged and ignored. Each job names the
worker state it starts from (the worker's last *accepted* job), so a lost job
leaves no trace on the worker either (``fedlm.worker_state``).

Checkpoints: at the top of the loop (a point where the whole state is in
``state_dict``), every ``reliability.checkpoint_every`` versions; ``run(...,
resume=state)`` continues from one, re-sending the jobs that were in flight.

Data: each job names the data shard it trains and where that shard's (or the
run's) inner schedule stands (``fedlm.shards``: a worker's own shard, or a
seeded draw of an under-sampled one), decided at dispatch and logged with it.

The engine owns: the global params and version, the clock, which worker is
busy, free or offline since when, the shards' progress, and the run log. It
knows nothing of the algorithm.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from fedlm import compression, faults
from fedlm.clock import VirtualClock
from fedlm.shards import ShardBook
from fedlm.config import Config
from fedlm.fleet import JobTimer, JobTiming, WorkerProfile
from fedlm.network import Network
from fedlm.params import BadUpdate, check_update, num_bytes, params_hash
from fedlm.store import IntervalKind, RunWriter
from fedlm import worker as worker_lib
from fedlm.worker import JobSpec
from fedlm.worker_state import FRESH
from strategies.base import Strategy, Update
from strategies.local_steps import LocalSteps


class EngineError(RuntimeError):
    """The run cannot go on (the message says why)."""


class Interrupted(EngineError):
    """The user asked the run to stop (Ctrl-C, SIGTERM)."""


@dataclass(frozen=True)
class Reply:
    """A job's reply as the transport delivers it: a result or an error."""

    job_id: int
    outer_grad: object | None  # OrderedDict[str, Tensor], None on error
    steps: int = 0
    tokens: int = 0
    train_loss: float = float("nan")
    compute_seconds: float = 0.0
    error: str | None = None
    wall_arrival: float = 0.0


class Transport(Protocol):
    """Runs jobs somewhere and hands back their replies in any order."""

    def submit(self, job: JobSpec, params) -> None: ...

    def collect(self, timeout: float) -> list[Reply]:
        """Replies that have arrived; waits up to ``timeout`` seconds for at least one."""
        ...


@dataclass(frozen=True)
class InFlight:
    job: JobSpec
    t_dispatch: float
    timing: JobTiming | None  # virtual durations; None on the wall clock
    index: int  # the worker's how-many-th job (seeds its data and faults)
    deadline: float  # the job is lost if it has not finished by then
    expires: bool = False  # virtual clock: it will miss its deadline (its event is the deadline)


@dataclass(frozen=True)
class Progress:
    version: int
    target: int
    virtual_time: float
    jobs: int
    tokens: int
    perplexity: float | None
    local_steps: int  # inner steps of all updates received
    budget: int  # local_step_budget (0: none)


def data_seed(seed: int, worker: int, job_index: int) -> int:
    """The data seed of a worker's k-th job: independent of other workers' jobs."""
    return int(np.random.SeedSequence([seed, 104729, worker, job_index]).generate_state(1)[0])


class Engine:
    def __init__(self, cfg: Config, *, strategy: Strategy, local_steps: LocalSteps,
                 transport: Transport, fleet: list[WorkerProfile], writer: RunWriter | None,
                 evaluate: Callable | None = None,
                 progress: Callable[[Progress], None] | None = None,
                 order: str = "virtual",
                 should_stop: Callable[[], bool] | None = None,
                 checkpoint: Callable[[dict], None] | None = None,
                 shard_sizes: list[int] | None = None) -> None:
        if order not in ("virtual", "wall"):
            raise ValueError(f"order: must be virtual or wall, got {order!r}")
        self.cfg = cfg
        self.order = order
        self.strategy = strategy
        self.policy = local_steps
        self.transport = (faults.DuplicatingTransport(transport) if cfg.faults.duplicate > 0
                          else transport)
        self.fleet = fleet
        self.writer = writer
        self.evaluate = evaluate
        self.progress = progress
        self.should_stop = should_stop or (lambda: False)
        self.checkpoint = checkpoint  # called with state_dict() every checkpoint_every versions
        self.timer = JobTimer(fleet, cfg.seed, cfg.network.intra_bw)
        # Which shard each job trains, and each shard's progress (fedlm.shards).
        # Only the paper's draw reads the shards' sizes (default: loaded from cfg).
        if shard_sizes is None:
            shard_sizes = (worker_lib.shard_sizes(cfg) if cfg.data.shard_choice == "paper"
                           else [1] * len(fleet))
        self.shards = ShardBook(shard_sizes, cfg.data.shard_choice, cfg.seed)
        self._sequences_per_step = [cfg.inner.batch_size * p.members for p in fleet]
        # Events: job ids (a job's completion, or its deadline if it will miss it)
        # and, negative, -(w + 1): worker w comes back online. With a shared
        # network (below) jobs move through tagged events instead: ("net", token),
        # ("compute", job), ("job", job), ("deadline", job).
        self.clock: VirtualClock = VirtualClock()
        n = cfg.network
        self.net = (Network(n.server_down, n.server_up, n.daily_amplitude, n.peak_hour)
                    if order == "virtual" and (n.server_down or n.server_up or n.daily_amplitude)
                    else None)
        self.phases: dict[int, list[float]] = {}  # shared network: a job's phase end times
        self.in_flight: dict[int, InFlight] = {}
        self.free_since: dict[int, float] = {}  # free worker -> time it became free
        self.offline: dict[int, tuple[float, float]] = {}  # worker -> (since, until)
        self._newly_free: list[int] = []  # freed since the last dispatch scan
        self._scanned_version = -1
        self._blocked = False  # a concurrency cap (or a lost job) asks for a full rescan
        self._sampler = np.random.default_rng([cfg.seed, 15485863])
        n = len(fleet)
        self.retired: set[int] = set()
        self.failures = [0] * n
        self.jobs_of = [0] * n
        self.state_job = [FRESH] * n  # each worker's last accepted job: its next start state
        self._pins: list[list[int]] = []  # state_job at each kept checkpoint
        self.settled: dict[int, str] = {}  # recent finished job -> done | lost (late replies)
        self.base_params: dict[int, object] = {}  # versions in-flight jobs started from
        self.arrived: dict[int, Reply] = {}  # replies not yet handed on, in arrival order
        self.next_job_id = 0
        self.op = 0  # operation counter: dispatches, updates, lost jobs
        self.seq = 0  # updates handed to the strategy
        self._held: list[int] = []  # seqs the strategy holds, not yet in a version
        self.version = 0
        self.tokens = 0
        self.steps_done = 0
        self.jobs_done = 0
        self.last_perplexity: float | None = None
        self._last_eval_version = -1
        self._checkpoint_due = False
        self._grace_from: float | None = None  # time of the batch's first job (grace)
        self._wall_start = time.monotonic()
        self.wall_start = time.time()

    @property
    def now(self) -> float:
        """Seconds since the start: virtual, or real on the wall clock."""
        if self.order == "virtual":
            return self.clock.now
        return time.monotonic() - self._wall_start

    def done(self) -> bool:
        """Stop at ``updates`` versions, or when a local-step or time budget is spent."""
        budget, limit = self.cfg.local_step_budget, self.cfg.time_budget
        return (self.version >= self.cfg.updates or (budget > 0 and self.steps_done >= budget)
                or (limit > 0 and self.now >= limit))

    # -- the loop -------------------------------------------------------------
    def run(self, params, resume: dict | None = None):
        """Train until ``cfg.updates`` global versions exist (or the local-step
        budget is spent; updates then held in a buffer are not applied); return
        the final params. ``resume``: a ``state_dict()`` to continue from."""
        self.strategy.start(params, num_workers=len(self.fleet))
        self.policy.start(steps=self.cfg.inner.steps,
                          step_times=[p.step_time for p in self.fleet])
        if resume is None:
            self.params = params
            self.model_bytes = num_bytes(params)
            self.up_bytes = compression.encoded_bytes(params, self.cfg.network)
            self.free_since = {w: 0.0 for w in range(len(self.fleet))}
            self._evaluate()
        else:
            self.load_state_dict(resume)
            for job_id in sorted(self.in_flight):  # the jobs the dead process was waiting for
                job = self.in_flight[job_id].job
                self.transport.submit(job, self.base_params[job.base_version])
        while True:
            if self._checkpoint_due and self._grace_from is None:
                self._write_checkpoint()
            if self._grace_from is None:
                if self.done():
                    break
                self._dispatch_free_workers()
                if not self.in_flight and not self.offline:
                    raise EngineError(f"stalled at version {self.version}: no job in flight "
                                      f"and strategy {self.strategy.name!r} gives none to "
                                      f"the {len(self.free_since)} free workers")
                self._handle(*self._next_event())
                # Grace period: jobs finishing within `grace` of this one are applied
                # right after it, so their workers restart from the same model.
                if self.cfg.time_budget and self.order == "virtual":
                    nxt = self.clock.peek()
                    if nxt is not None and nxt[0] > self.cfg.time_budget:
                        break  # the next job would finish after the time budget
                if self.order == "virtual" and self.cfg.grace > 0:
                    self._grace_from = self.now
            else:
                nxt = self.clock.peek()
                if (self.done() or nxt is None or nxt[0] > self._grace_from + self.cfg.grace):
                    self._grace_from = None
                else:
                    self._handle(*self._next_event())
        if self._last_eval_version != self.version:
            self._evaluate()
        self._close_timeline()
        return self.params

    def _candidates(self) -> list[int]:
        """Free workers to offer a job, in the order they are offered.

        The strategy is asked about a free worker when it becomes free and again
        whenever the global version changes (or a concurrency cap blocked
        someone): a sync barrier then costs one scan per round, not one per
        finished job — what keeps 100,000 simulated workers cheap.
        """
        if self.version != self._scanned_version or self._blocked:
            pool = list(self.free_since)
        else:
            pool = [w for w in self._newly_free if w in self.free_since]
        self._newly_free = []
        self._scanned_version = self.version
        self._blocked = False
        cap = self.cfg.concurrency
        if cap and len(pool) > cap - len(self.in_flight):
            # More candidates than slots: sample uniformly among the available
            # ones (seeded), as FedScale does, instead of favouring low indices.
            return [pool[i] for i in self._sampler.permutation(len(pool))]
        return sorted(pool)

    def _keep_from(self, w: int) -> int:
        """The oldest state of ``w`` still needed: by its next job or a kept checkpoint."""
        return min([self.state_job[w], *(pin[w] for pin in self._pins)])

    def _deadline(self, w: int, steps: int, timing: JobTiming | None) -> float:
        """Seconds a job may take: configured, or a multiple of its nominal virtual time."""
        r = self.cfg.reliability
        if r.deadline > 0:
            return r.deadline
        if timing is None:  # wall clock without a configured deadline
            return self.cfg.sim.reply_timeout
        nominal = timing.download + steps * self.fleet[w].step_time + timing.upload
        return r.deadline_factor * nominal

    def _dispatch_free_workers(self) -> None:
        now = self.now
        cap = self.cfg.concurrency
        for w in self._candidates():
            if cap and len(self.in_flight) >= cap:
                self._blocked = True
                break
            if w in self.retired or not self.strategy.wants_job(w, version=self.version):
                continue
            steps = self.policy.local_steps(w)
            index = self.jobs_of[w]
            fault = faults.draw(self.cfg, w, index)
            shard = self.shards.pick(w)
            cursor, run_steps = self.shards.take(shard, steps,
                                                 steps * self._sequences_per_step[w])
            schedule_step = {"worker": -1, "shard": cursor,
                             "global": run_steps}[self.cfg.inner.schedule]
            job = JobSpec(self.next_job_id, w, self.version, steps,
                          data_seed(self.cfg.seed, w, index), prev_job=self.state_job[w],
                          keep_from=self._keep_from(w), fault=fault, shard=shard,
                          cursor=cursor, schedule_step=schedule_step)
            self.next_job_id += 1
            self.jobs_of[w] += 1
            timing = (self.timer.timing(w, steps, self.model_bytes, self.up_bytes)
                      if self.order == "virtual" else None)
            if self.net is not None:  # nominal transfer times at this hour's bandwidth
                region, m = self.fleet[w].region, self.net.factor(now)
                timing = JobTiming(region.latency + self.model_bytes / (region.down_bw * m),
                                   timing.compute,
                                   region.latency + self.up_bytes / (region.up_bw * m))
            limit = now + self._deadline(w, steps, timing)
            expires = (timing is not None and self.net is None
                       and (fault == "hang" or now + timing.total > limit))
            self._log_intervals([(w, IntervalKind.IDLE, self.free_since.pop(w), now,
                                  self.version, None)])
            self.strategy.on_dispatch(w, version=self.version)
            self.in_flight[job.job_id] = InFlight(job, now, timing, index, limit, expires)
            if self.checkpoint is not None:  # a checkpoint must be able to re-send it
                self.base_params.setdefault(self.version, self.params)
            if self.net is not None:  # the job's download joins the shared link
                self.net.add(now, (job.job_id, "down"), "down", self.model_bytes,
                             self.fleet[w].region.down_bw)
                self.phases[job.job_id] = [now]
                self.clock.schedule(limit, ("deadline", job.job_id))
                self._schedule_network()
            elif timing is not None:
                self.clock.schedule(limit if expires else now + timing.total, job.job_id)
            if self.writer:
                self.writer.add_job(job, op=self._next_op(), t_dispatch=now,
                                    down_bytes=self.model_bytes, up_bytes=self.up_bytes)
                if fault:
                    self.writer.add_event(kind="fault_injected", virtual_time=now, worker=w,
                                          job_id=job.job_id, detail=fault)
            self.transport.submit(job, self.params)

    def _next_op(self) -> int:
        self.op += 1
        return self.op - 1

    def _next_event(self) -> tuple[int, Reply | None]:
        """The next thing that happens: a job to hand on (earliest virtual
        completion or deadline, or first real arrival or missed deadline), or
        ``(-(w + 1), None)``: worker w is back online."""
        if self.order == "virtual":
            _, event = self.clock.pop()
            while isinstance(event, tuple):  # the shared network's own events
                found = self._network_event(*event)
                if found is not None:
                    return found
                _, event = self.clock.pop()
            if event < 0:
                return event, None
            reply = self._wait_for(event)
            if self.in_flight[event].expires:  # what came back came too late
                self._ignore(reply, "late_reply")
                return event, self._missed_deadline(event)
            return event, reply
        while not self.arrived:
            now = self.now
            back = [w for w, (_, until) in self.offline.items() if until <= now]
            if back:
                return -(min(back) + 1), None
            overdue = [j for j, f in self.in_flight.items() if f.deadline <= now]
            if overdue:
                return min(overdue), self._missed_deadline(min(overdue))
            soonest = min([f.deadline for f in self.in_flight.values()]
                          + [u for _, u in self.offline.values()], default=now + 1.0)
            self._receive(min(max(soonest - now, 0.0), 1.0))
        job_id = next(iter(self.arrived))  # dicts keep insertion (= arrival) order
        return job_id, self.arrived.pop(job_id)

    # -- the shared network (virtual clock) -------------------------------------
    def _schedule_network(self) -> None:
        """Put the network's next change on the clock (older such events go stale)."""
        t = self.net.next_finish()
        if t is not None:
            self.clock.schedule(max(t, self.clock.now), ("net", self.net.token))

    def _network_event(self, kind: str, key: int) -> tuple[int, Reply] | None:
        """Move a job along download -> compute -> upload; return what the loop
        must handle (a finished or expired job), or None."""
        now = self.clock.now
        if kind == "net":
            if key != self.net.token:
                return None  # the flows changed since this was scheduled
            for job_id, phase in self.net.advance(now):
                f = self.in_flight[job_id]
                latency = self.fleet[f.job.worker].region.latency
                self.phases[job_id].append(now + latency)
                if phase == "up":
                    self.clock.schedule(now + latency, ("job", job_id))
                elif f.job.fault != "hang":  # a hung worker never computes nor replies
                    self.clock.schedule(now + latency + f.timing.compute, ("compute", job_id))
            self._schedule_network()
        elif key in self.in_flight:
            if kind == "compute":
                self.phases[key].append(now)
                self.net.add(now, (key, "up"), "up", self.up_bytes,
                             self.fleet[self.in_flight[key].job.worker].region.up_bw)
                self._schedule_network()
            elif kind == "job":
                return key, self._wait_for(key)
            else:  # deadline: whatever it still sends is too late
                self.net.remove(now, (key, "down"))
                self.net.remove(now, (key, "up"))
                self._schedule_network()
                self._ignore(self._wait_for(key), "late_reply")
                return key, self._missed_deadline(key)
        return None

    def _missed_deadline(self, job_id: int) -> Reply:
        f = self.in_flight[job_id]
        return Reply(job_id, None, wall_arrival=time.time(),
                     error=f"deadline: no reply within {f.deadline - f.t_dispatch:.1f} s")

    def _receive(self, timeout: float) -> None:
        if self.should_stop():
            raise Interrupted(f"interrupted at version {self.version}")
        for reply in self.transport.collect(timeout=timeout):
            if reply.job_id in self.in_flight and reply.job_id not in self.arrived:
                self.arrived[reply.job_id] = reply
            else:
                self._ignore(reply, "duplicate_reply" if reply.job_id in self.arrived
                             or self.settled.get(reply.job_id) == "done" else "late_reply")

    def _ignore(self, reply: Reply, kind: str) -> None:
        if self.writer:  # a reply for a job we no longer wait for
            self.writer.add_event(kind=kind, virtual_time=self.now, job_id=reply.job_id,
                                  detail="ignored" + (f" ({reply.error})" if reply.error else ""))

    def _wait_for(self, job_id: int) -> Reply:
        """Block until the reply of ``job_id`` has arrived; keep the others for later."""
        deadline = time.monotonic() + self.cfg.sim.reply_timeout
        while job_id not in self.arrived:
            left = deadline - time.monotonic()
            if left <= 0:
                return Reply(job_id, None, error=f"no reply within {self.cfg.sim.reply_timeout} s",
                             wall_arrival=time.time())
            self._receive(min(left, 1.0))
        return self.arrived.pop(job_id)

    def _job_intervals(self, f: InFlight, end: float, compute_seconds: float):
        """download / compute / upload spans of a job, cut at ``end``."""
        t0, w, job = f.t_dispatch, f.job.worker, f.job
        if job.job_id in self.phases:  # shared network: what took longer than the
            # job's own link alone would have was waiting on the shared link
            ph = self.phases.pop(job.job_id)[1:]
            down, comp = (ph + [end, end])[:2]
            up = ph[2] if len(ph) > 2 else end
            spans = [(IntervalKind.DOWNLOAD, t0, t0 + f.timing.download),
                     (IntervalKind.LINK_WAIT, t0 + f.timing.download, down),
                     (IntervalKind.COMPUTE, down, comp),
                     (IntervalKind.UPLOAD, comp, comp + f.timing.upload),
                     (IntervalKind.LINK_WAIT, comp + f.timing.upload, up)]
            return [(w, k, min(a, end), min(max(a, b), end), job.base_version, job.job_id)
                    for k, a, b in spans]
        if f.timing is not None:
            a = t0 + f.timing.download
            b = a + f.timing.compute
        else:  # wall clock: the client reports its compute time; the rest is transfer
            b = end
            a = max(t0, end - compute_seconds)
        return [(w, IntervalKind.DOWNLOAD, t0, min(a, end), job.base_version, job.job_id),
                (w, IntervalKind.COMPUTE, min(a, end), min(b, end), job.base_version, job.job_id),
                (w, IntervalKind.UPLOAD, min(b, end), end, job.base_version, job.job_id)]

    def _handle(self, event: int, reply: Reply | None) -> None:
        if event < 0:
            self._back_online(-event - 1)
        else:
            self._complete(event, reply)

    def _complete(self, job_id: int, reply: Reply) -> None:
        flight = self.in_flight.pop(job_id)
        job, t0 = flight.job, flight.t_dispatch
        now = self.now
        w = job.worker
        self._log_intervals(self._job_intervals(flight, now, reply.compute_seconds))

        error, reason = reply.error, "error"
        if error is not None and error.startswith("deadline"):
            reason = "deadline"
        grad = None
        if error is None:  # decode what came over the wire, then check it
            try:
                grad = compression.decode(reply.outer_grad, self.params, self.cfg.network)
                check_update(grad, self.params)
            except BadUpdate as exc:
                error, reason = f"rejected update: {exc}", "rejected"
        if error is not None:
            self._job_failed(flight, error, reason)
            return
        self.failures[w] = 0
        self.state_job[w] = job_id
        self._settle(job_id, "done")
        self._release(w, flight.index)

        update = Update(worker=w, job_id=job_id, base_version=job.base_version,
                        outer_grad=grad, tokens=reply.tokens,
                        local_steps=reply.steps, staleness=self.version - job.base_version)
        self.tokens += reply.tokens
        self.steps_done += reply.steps
        self.jobs_done += 1
        if self.writer:
            self.writer.add_update({
                "seq": self.seq, "op": self._next_op(), "job_id": job_id, "worker": w,
                "base_version": job.base_version, "received_version": self.version,
                "staleness": update.staleness, "local_steps": reply.steps,
                "data_seed": job.data_seed, "tokens": reply.tokens,
                "train_loss": reply.train_loss, "t_dispatch": t0, "t_done": now,
                "wall_arrival": reply.wall_arrival, "compute_seconds": reply.compute_seconds,
                "update_hash": params_hash(grad)})
            self.writer.end_job(job_id, status="done", op=self.op - 1)
        self._held.append(self.seq)
        self.seq += 1
        compute = flight.timing.compute if flight.timing is not None else reply.compute_seconds
        self.policy.observe(w, steps=reply.steps, seconds=compute)
        new_params = self.strategy.on_update(update, self.params)
        if new_params is not None:
            self._new_version(new_params)
        if self.writer:
            self.writer.commit(force=False)
        self._report()

    def _new_version(self, new_params) -> None:
        self.params = new_params
        self.version += 1
        if self.base_params:  # keep only versions that jobs still in flight started from
            used = {f.job.base_version for f in self.in_flight.values()}
            self.base_params = {v: p for v, p in self.base_params.items() if v in used}
        if self.writer:
            self.writer.mark_applied(self.version, self._held)
        self._held = []
        if self.version % self.cfg.eval.every == 0:
            self._evaluate()
        every = self.cfg.reliability.checkpoint_every
        if self.checkpoint is not None and every and self.version % every == 0:
            self._checkpoint_due = True

    def _job_failed(self, flight: InFlight, error: str, reason: str) -> None:
        job, w = flight.job, flight.job.worker
        self.failures[w] += 1
        self._settle(job.job_id, "lost")
        limit = self.cfg.reliability.max_failures
        if self.failures[w] >= limit:
            self.retired.add(w)
            reason = "retired"
        if self.writer:
            self.writer.add_event(kind="job_failed", virtual_time=self.now, worker=w,
                                  job_id=job.job_id, detail=error)
            self.writer.end_job(job.job_id, status="lost", op=self._next_op(), computed=False,
                                reason=reason)
            if reason == "retired":
                self.writer.add_event(kind="worker_retired", virtual_time=self.now, worker=w,
                                      detail=f"{self.failures[w]} failures in a row")
        if len(self.retired) == len(self.fleet):
            raise EngineError(f"every worker failed {limit} jobs in a row; last error: {error}")
        if w not in self.retired:
            self._release(w, flight.index)
        self._blocked = True  # the strategy may now want jobs from anyone (a new round)
        new_params = self.strategy.on_job_lost(w, job_id=job.job_id, reason=reason,
                                               params=self.params)
        if new_params is not None:  # e.g. a sync round closed with the replies it had
            if self.writer:
                self.writer.add_event(kind="round_closed", virtual_time=self.now,
                                      detail=f"version {self.version + 1} from "
                                             f"{len(self._held)} updates after a lost job")
            self._new_version(new_params)
        if self.writer:
            self.writer.commit(force=False)
        self._report()

    def _settle(self, job_id: int, how: str) -> None:
        self.settled[job_id] = how
        if len(self.settled) > 4 * len(self.fleet) + 64:  # only recent ones get late replies
            del self.settled[next(iter(self.settled))]

    def _release(self, w: int, index: int) -> None:
        """A worker's job is over: it is free now, or goes offline for a while."""
        now = self.now
        if faults.goes_offline(self.cfg, w, index):
            until = now + self.cfg.faults.offline_seconds
            self.offline[w] = (now, until)
            if self.order == "virtual":
                self.clock.schedule(until, -(w + 1))
            if self.writer:
                self.writer.add_event(kind="worker_offline", virtual_time=now, worker=w,
                                      detail=f"for {self.cfg.faults.offline_seconds:g} s")
            return
        self.free_since[w] = now
        self._newly_free.append(w)

    def _back_online(self, w: int) -> None:
        since, _ = self.offline.pop(w)
        now = self.now
        self._log_intervals([(w, IntervalKind.OFFLINE, since, now, self.version, None)])
        if self.writer:
            self.writer.add_event(kind="worker_online", virtual_time=now, worker=w,
                                  detail=f"after {now - since:.1f} s offline")
        self.free_since[w] = now
        self._newly_free.append(w)

    # -- checkpoints ------------------------------------------------------------
    def _write_checkpoint(self) -> None:
        self._checkpoint_due = False
        self._pins = [*self._pins, list(self.state_job)][-self.cfg.reliability.checkpoint_keep:]
        if self.writer:  # logged first: rows after the checkpoint are undone on resume
            self.writer.add_event(kind="checkpoint", virtual_time=self.now,
                                  detail=f"version {self.version}, op {self.op}")
        self.checkpoint(self.state_dict())

    def state_dict(self) -> dict:
        """Everything the loop needs to go on from here (at the top of the loop)."""
        return {
            "params": self.params, "model_bytes": self.model_bytes, "up_bytes": self.up_bytes,
            "network": self.net.state_dict() if self.net else None,
            "phases": {j: list(p) for j, p in self.phases.items()},
            "base_params": dict(self.base_params), "version": self.version, "now": self.now,
            "strategy": self.strategy.state_dict(), "policy": self.policy.state_dict(),
            "timer": self.timer.state_dict(), "clock": self.clock.state_dict(),
            "shards": self.shards.state_dict(),
            "sampler": self._sampler.bit_generator.state,
            "in_flight": {j: (f.job, f.t_dispatch, f.timing, f.index, f.deadline, f.expires)
                          for j, f in self.in_flight.items()},
            "free_since": dict(self.free_since), "offline": dict(self.offline),
            "newly_free": list(self._newly_free), "scanned_version": self._scanned_version,
            "blocked": self._blocked, "retired": sorted(self.retired),
            "failures": list(self.failures), "jobs_of": list(self.jobs_of),
            "state_job": list(self.state_job), "pins": [list(p) for p in self._pins],
            "settled": dict(self.settled), "next_job_id": self.next_job_id, "op": self.op,
            "seq": self.seq, "held": list(self._held), "tokens": self.tokens,
            "steps_done": self.steps_done, "jobs_done": self.jobs_done,
            "last_perplexity": self.last_perplexity,
            "last_eval_version": self._last_eval_version,
        }

    def load_state_dict(self, st: dict) -> None:
        self.params, self.model_bytes = st["params"], st["model_bytes"]
        self.up_bytes = st["up_bytes"]
        if self.net is not None:
            self.net.load_state_dict(st["network"])
        self.phases = {j: list(p) for j, p in st["phases"].items()}
        self.base_params = dict(st["base_params"])
        self.version = st["version"]
        self.strategy.load_state_dict(st["strategy"])
        self.policy.load_state_dict(st["policy"])
        self.timer.load_state_dict(st["timer"])
        self.clock.load_state_dict(st["clock"])
        if "shards" in st:  # checkpoints written before data shards were counted lack it
            self.shards.load_state_dict(st["shards"])
        self._sampler.bit_generator.state = st["sampler"]
        self.in_flight = {j: InFlight(*v) for j, v in st["in_flight"].items()}
        self.free_since, self.offline = dict(st["free_since"]), dict(st["offline"])
        self._newly_free, self._scanned_version = list(st["newly_free"]), st["scanned_version"]
        self._blocked, self.retired = st["blocked"], set(st["retired"])
        self.failures, self.jobs_of = list(st["failures"]), list(st["jobs_of"])
        self.state_job, self._pins = list(st["state_job"]), [list(p) for p in st["pins"]]
        self.settled, self.next_job_id = dict(st["settled"]), st["next_job_id"]
        self.op, self.seq, self._held = st["op"], st["seq"], list(st["held"])
        self.tokens, self.steps_done = st["tokens"], st["steps_done"]
        self.jobs_done, self.last_perplexity = st["jobs_done"], st["last_perplexity"]
        self._last_eval_version = st["last_eval_version"]
        self._wall_start = time.monotonic() - st["now"]  # wall clock: go on from there

    # -- bookkeeping ----------------------------------------------------------
    def _log_intervals(self, rows) -> None:
        if self.writer:
            self.writer.add_intervals(rows)

    def _close_timeline(self) -> None:
        """At the end: free workers were idle until now, offline ones offline;
        jobs in flight are cut at now."""
        end = self.now
        rows = [(w, IntervalKind.IDLE, t, end, self.version, None)
                for w, t in sorted(self.free_since.items())]
        rows += [(w, IntervalKind.OFFLINE, since, end, self.version, None)
                 for w, (since, _) in sorted(self.offline.items())]
        for _, f in sorted(self.in_flight.items()):
            rows += self._job_intervals(f, end, compute_seconds=0.0)
        self._log_intervals(rows)
        if self.writer:
            self.writer.commit()

    def _evaluate(self) -> None:
        self._last_eval_version = self.version
        if self.evaluate is None:
            return
        ev = self.evaluate(self.params)
        self.last_perplexity = ev.perplexity
        if self.writer:
            self.writer.add_metric(version=self.version, virtual_time=self.now,
                                   wall_time=time.time() - self.wall_start, tokens=self.tokens,
                                   jobs=self.jobs_done, loss=ev.loss, perplexity=ev.perplexity,
                                   bits_per_byte=ev.bits_per_byte)
            self.writer.commit()
        self._report()

    def _report(self) -> None:
        if self.progress:
            self.progress(Progress(self.version, self.cfg.updates, self.now,
                                   self.jobs_done, self.tokens, self.last_perplexity,
                                   self.steps_done, self.cfg.local_step_budget))
