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

The engine owns: the global params and version, the clock, which worker is
busy or free since when, and the run log. It knows nothing of the algorithm.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from fedlm.clock import VirtualClock
from fedlm.config import Config
from fedlm.fleet import JobTimer, JobTiming, WorkerProfile
from fedlm.params import BadUpdate, check_update, num_bytes, params_hash
from fedlm.store import IntervalKind, RunWriter
from fedlm.worker import JobSpec
from strategies.base import Strategy, Update
from strategies.local_steps import LocalSteps

MAX_CONSECUTIVE_FAILURES = 3  # a worker failing this many jobs in a row is retired


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
                 should_stop: Callable[[], bool] | None = None) -> None:
        if order not in ("virtual", "wall"):
            raise ValueError(f"order: must be virtual or wall, got {order!r}")
        self.cfg = cfg
        self.order = order
        self.strategy = strategy
        self.policy = local_steps
        self.transport = transport
        self.fleet = fleet
        self.writer = writer
        self.evaluate = evaluate
        self.progress = progress
        self.should_stop = should_stop or (lambda: False)
        self.timer = JobTimer(fleet, cfg.seed)
        self.clock: VirtualClock[int] = VirtualClock()  # events: job ids
        self.in_flight: dict[int, InFlight] = {}
        self.free_since: dict[int, float] = {}  # free worker -> time it became free
        self._newly_free: list[int] = []  # freed since the last dispatch scan
        self._scanned_version = -1
        self._blocked = False  # a concurrency cap stopped the last scan
        self._sampler = np.random.default_rng([cfg.seed, 15485863])
        self.retired: set[int] = set()
        self.failures = [0] * len(fleet)
        self.jobs_of = [0] * len(fleet)
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
    def run(self, params):
        """Train until ``cfg.updates`` global versions exist (or the local-step
        budget is spent; updates then held in a buffer are not applied); return
        the final params."""
        self.params = params
        self.model_bytes = num_bytes(params)
        self.strategy.start(params, num_workers=len(self.fleet))
        self.policy.start(steps=self.cfg.inner.steps,
                          step_times=[p.step_time for p in self.fleet])
        self.free_since = {w: 0.0 for w in range(len(self.fleet))}
        self._evaluate()
        while not self.done():
            self._dispatch_free_workers()
            if not self.in_flight:
                raise EngineError(f"stalled at version {self.version}: no job in flight and "
                                  f"strategy {self.strategy.name!r} gives none to the "
                                  f"{len(self.free_since)} free workers")
            self._complete(*self._next_finished())
            # Grace period: jobs finishing within `grace` of this one are applied
            # right after it, so their workers restart from the same model.
            if self.cfg.time_budget and self.order == "virtual":
                nxt = self.clock.peek()
                if nxt is not None and nxt[0] > self.cfg.time_budget:
                    break  # the next job would finish after the time budget
            first = self.now
            while (self.order == "virtual" and self.cfg.grace > 0
                   and not self.done() and self.clock.peek() is not None
                   and self.clock.peek()[0] <= first + self.cfg.grace):
                self._complete(*self._next_finished())
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
            job = JobSpec(self.next_job_id, w, self.version, steps,
                          data_seed(self.cfg.seed, w, self.jobs_of[w]))
            self.next_job_id += 1
            self.jobs_of[w] += 1
            timing = (self.timer.timing(w, steps, self.model_bytes, self.model_bytes)
                      if self.order == "virtual" else None)
            self._log_intervals([(w, IntervalKind.IDLE, self.free_since.pop(w), now,
                                  self.version, None)])
            self.strategy.on_dispatch(w, version=self.version)
            self.in_flight[job.job_id] = InFlight(job, now, timing)
            if timing is not None:
                self.clock.schedule(now + timing.total, job.job_id)
            if self.writer:
                self.writer.add_job(job, op=self._next_op(), t_dispatch=now)
            self.transport.submit(job, self.params)

    def _next_op(self) -> int:
        self.op += 1
        return self.op - 1

    def _next_finished(self) -> tuple[int, Reply]:
        """The next job to hand on: earliest virtual completion, or first real arrival."""
        if self.order == "virtual":
            _, job_id = self.clock.pop()
            return job_id, self._wait_for(job_id)
        deadline = time.monotonic() + self.cfg.sim.reply_timeout
        while not self.arrived:
            left = deadline - time.monotonic()
            if left <= 0:  # nothing at all within the timeout: give up on the oldest job
                job_id = min(self.in_flight)
                return job_id, Reply(job_id, None, wall_arrival=time.time(),
                                     error=f"no reply within {self.cfg.sim.reply_timeout} s")
            self._receive(min(left, 1.0))
        job_id = next(iter(self.arrived))  # dicts keep insertion (= arrival) order
        return job_id, self.arrived.pop(job_id)

    def _receive(self, timeout: float) -> None:
        if self.should_stop():
            raise Interrupted(f"interrupted at version {self.version}")
        for reply in self.transport.collect(timeout=timeout):
            if reply.job_id in self.in_flight and reply.job_id not in self.arrived:
                self.arrived[reply.job_id] = reply
            elif self.writer:  # a reply for a job we no longer wait for
                self.writer.add_event(kind="duplicate_reply", virtual_time=self.now,
                                      job_id=reply.job_id, detail="ignored")

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
        if f.timing is not None:
            a = t0 + f.timing.download
            b = a + f.timing.compute
        else:  # wall clock: the client reports its compute time; the rest is transfer
            b = end
            a = max(t0, end - compute_seconds)
        return [(w, IntervalKind.DOWNLOAD, t0, min(a, end), job.base_version, job.job_id),
                (w, IntervalKind.COMPUTE, min(a, end), min(b, end), job.base_version, job.job_id),
                (w, IntervalKind.UPLOAD, min(b, end), end, job.base_version, job.job_id)]

    def _complete(self, job_id: int, reply: Reply) -> None:
        flight = self.in_flight.pop(job_id)
        job, t0 = flight.job, flight.t_dispatch
        now = self.now
        w = job.worker
        self._log_intervals(self._job_intervals(flight, now, reply.compute_seconds))
        self.free_since[w] = now
        self._newly_free.append(w)

        error = reply.error
        if error is None:
            try:
                check_update(reply.outer_grad, self.params)
            except BadUpdate as exc:
                error = f"rejected update: {exc}"
        if error is not None:
            # A rejected update was computed (the worker's optimizer moved on);
            # an error reply means the ClientApp did not finish.
            self._job_failed(job, error, computed=reply.error is None)
            return
        self.failures[w] = 0

        update = Update(worker=w, job_id=job_id, base_version=job.base_version,
                        outer_grad=reply.outer_grad, tokens=reply.tokens,
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
                "update_hash": params_hash(reply.outer_grad)})
            self.writer.end_job(job_id, status="done", op=self.op - 1)
        self._held.append(self.seq)
        self.seq += 1
        compute = flight.timing.compute if flight.timing is not None else reply.compute_seconds
        self.policy.observe(w, steps=reply.steps, seconds=compute)
        new_params = self.strategy.on_update(update, self.params)
        if new_params is not None:
            self.params = new_params
            self.version += 1
            if self.writer:
                self.writer.mark_applied(self.version, self._held)
            self._held = []
            if self.version % self.cfg.eval.every == 0:
                self._evaluate()
        if self.writer:
            self.writer.commit(force=False)
        self._report()

    def _job_failed(self, job: JobSpec, error: str, computed: bool) -> None:
        w = job.worker
        self.failures[w] += 1
        if self.writer:
            self.writer.add_event(kind="job_failed", virtual_time=self.now, worker=w,
                                  job_id=job.job_id, detail=error)
            self.writer.end_job(job.job_id, status="lost", op=self._next_op(), computed=computed)
        self.strategy.on_job_lost(w, job_id=job.job_id)
        if self.failures[w] >= MAX_CONSECUTIVE_FAILURES:
            self.retired.add(w)
            if self.writer:
                self.writer.add_event(kind="worker_retired", virtual_time=self.now,
                                      worker=w, detail=f"{self.failures[w]} failures in a row")
        if len(self.retired) == len(self.fleet):
            raise EngineError(f"every worker failed {MAX_CONSECUTIVE_FAILURES} jobs in a row; "
                              f"last error: {error}")
        if self.writer:
            self.writer.commit(force=False)

    # -- bookkeeping ----------------------------------------------------------
    def _log_intervals(self, rows) -> None:
        if self.writer:
            self.writer.add_intervals(rows)

    def _close_timeline(self) -> None:
        """At the end: free workers were idle until now; jobs in flight are cut at now."""
        end = self.now
        rows = [(w, IntervalKind.IDLE, t, end, self.version, None)
                for w, t in sorted(self.free_since.items())]
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
