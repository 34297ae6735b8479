"""The engine: one loop for synchronous and asynchronous training.

Each time a worker is free the engine asks the strategy whether it gets a job
(sync: only when the round's barrier has passed; async: always) and the
local-steps policy how many inner steps. A dispatched job's virtual duration
is known at once from the worker's profile (download + compute + upload), so
its completion goes on the virtual clock while its real compute runs — in
parallel with every other outstanding job — behind a ``Transport`` (Flower's
Grid in ``server_app``; an in-process trainer in tests and replay).

Results are handed to the strategy in *virtual-completion* order, never in
real arrival order; that makes a simulated run a pure function of its config
and seed, however Ray schedules the compute.

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
    timing: JobTiming


@dataclass(frozen=True)
class Progress:
    version: int
    target: int
    virtual_time: float
    jobs: int
    tokens: int
    perplexity: float | None


def data_seed(seed: int, worker: int, job_index: int) -> int:
    """The data seed of a worker's k-th job: independent of other workers' jobs."""
    return int(np.random.SeedSequence([seed, 104729, worker, job_index]).generate_state(1)[0])


class Engine:
    def __init__(self, cfg: Config, *, strategy: Strategy, local_steps: LocalSteps,
                 transport: Transport, fleet: list[WorkerProfile], writer: RunWriter | None,
                 evaluate: Callable | None = None,
                 progress: Callable[[Progress], None] | None = None) -> None:
        self.cfg = cfg
        self.strategy = strategy
        self.policy = local_steps
        self.transport = transport
        self.fleet = fleet
        self.writer = writer
        self.evaluate = evaluate
        self.progress = progress
        self.timer = JobTimer(fleet, cfg.seed)
        self.clock: VirtualClock[int] = VirtualClock()  # events: job ids
        self.in_flight: dict[int, InFlight] = {}
        self.free_since: dict[int, float] = {}  # free worker -> virtual time it became free
        self.retired: set[int] = set()
        self.failures = [0] * len(fleet)
        self.jobs_of = [0] * len(fleet)
        self.arrived: dict[int, Reply] = {}
        self.next_job_id = 0
        self.seq = 0
        self.version = 0
        self.tokens = 0
        self.jobs_done = 0
        self.last_perplexity: float | None = None
        self.wall_start = time.time()

    # -- the loop -------------------------------------------------------------
    def run(self, params):
        """Train until ``cfg.updates`` global versions exist; return the final params."""
        self.params = params
        self.model_bytes = num_bytes(params)
        self.strategy.start(params, num_workers=len(self.fleet))
        self.policy.start(steps=self.cfg.inner.steps,
                          step_times=[p.step_time for p in self.fleet])
        self.free_since = {w: 0.0 for w in range(len(self.fleet))}
        self._evaluate()
        while self.version < self.cfg.updates:
            self._dispatch_free_workers()
            if not self.in_flight:
                raise EngineError(f"stalled at version {self.version}: no job in flight and "
                                  f"strategy {self.strategy.name!r} gives none to the "
                                  f"{len(self.free_since)} free workers")
            t, job_id = self.clock.pop()
            self._complete(job_id, self._wait_for(job_id))
        if self._last_eval_version != self.version:
            self._evaluate()
        self._close_timeline()
        return self.params

    def _dispatch_free_workers(self) -> None:
        now = self.clock.now
        for w in sorted(self.free_since):
            if w in self.retired or not self.strategy.wants_job(w, version=self.version):
                continue
            steps = self.policy.local_steps(w)
            job = JobSpec(self.next_job_id, w, self.version, steps,
                          data_seed(self.cfg.seed, w, self.jobs_of[w]))
            self.next_job_id += 1
            self.jobs_of[w] += 1
            timing = self.timer.timing(w, steps, self.model_bytes, self.model_bytes)
            self._log_intervals([(w, IntervalKind.IDLE, self.free_since.pop(w), now,
                                  self.version, None)])
            self.strategy.on_dispatch(w, version=self.version)
            self.in_flight[job.job_id] = InFlight(job, now, timing)
            self.clock.schedule(now + timing.total, job.job_id)
            self.transport.submit(job, self.params)

    def _wait_for(self, job_id: int) -> Reply:
        """Block until the reply of ``job_id`` has arrived; keep the others for later."""
        deadline = time.monotonic() + self.cfg.sim.reply_timeout
        while job_id not in self.arrived:
            left = deadline - time.monotonic()
            if left <= 0:
                return Reply(job_id, None, error=f"no reply within {self.cfg.sim.reply_timeout} s",
                             wall_arrival=time.time())
            for reply in self.transport.collect(timeout=min(left, 1.0)):
                if reply.job_id in self.in_flight and reply.job_id not in self.arrived:
                    self.arrived[reply.job_id] = reply
                elif self.writer:  # a reply for a job we no longer wait for
                    self.writer.add_event(kind="duplicate_reply", virtual_time=self.clock.now,
                                          job_id=reply.job_id, detail="ignored")
        return self.arrived.pop(job_id)

    def _complete(self, job_id: int, reply: Reply) -> None:
        flight = self.in_flight.pop(job_id)
        job, t0, tm = flight.job, flight.t_dispatch, flight.timing
        now = self.clock.now
        w = job.worker
        self._log_intervals([
            (w, IntervalKind.DOWNLOAD, t0, t0 + tm.download, job.base_version, job_id),
            (w, IntervalKind.COMPUTE, t0 + tm.download, t0 + tm.download + tm.compute,
             job.base_version, job_id),
            (w, IntervalKind.UPLOAD, t0 + tm.download + tm.compute, now, job.base_version, job_id),
        ])
        self.free_since[w] = now

        error = reply.error
        if error is None:
            try:
                check_update(reply.outer_grad, self.params)
            except BadUpdate as exc:
                error = f"rejected update: {exc}"
        if error is not None:
            self._job_failed(job, error)
            return
        self.failures[w] = 0

        update = Update(worker=w, job_id=job_id, base_version=job.base_version,
                        outer_grad=reply.outer_grad, tokens=reply.tokens,
                        local_steps=reply.steps, staleness=self.version - job.base_version)
        self.tokens += reply.tokens
        self.jobs_done += 1
        if self.writer:
            self.writer.add_update({
                "seq": self.seq, "job_id": job_id, "worker": w,
                "base_version": job.base_version, "received_version": self.version,
                "staleness": update.staleness, "local_steps": reply.steps,
                "data_seed": job.data_seed, "tokens": reply.tokens,
                "train_loss": reply.train_loss, "t_dispatch": t0, "t_done": now,
                "wall_arrival": reply.wall_arrival, "compute_seconds": reply.compute_seconds,
                "update_hash": params_hash(reply.outer_grad)})
        self.seq += 1
        self.policy.observe(w, steps=reply.steps, seconds=tm.compute)
        new_params = self.strategy.on_update(update, self.params)
        if new_params is not None:
            self.params = new_params
            self.version += 1
            if self.writer:
                self.writer.mark_applied(self.version)
            if self.version % self.cfg.eval.every == 0:
                self._evaluate()
        if self.writer:
            self.writer.commit()
        self._report()

    def _job_failed(self, job: JobSpec, error: str) -> None:
        w = job.worker
        self.failures[w] += 1
        if self.writer:
            self.writer.add_event(kind="job_failed", virtual_time=self.clock.now, worker=w,
                                  job_id=job.job_id, detail=error)
        self.strategy.on_job_lost(w, job_id=job.job_id)
        if self.failures[w] >= MAX_CONSECUTIVE_FAILURES:
            self.retired.add(w)
            if self.writer:
                self.writer.add_event(kind="worker_retired", virtual_time=self.clock.now,
                                      worker=w, detail=f"{self.failures[w]} failures in a row")
        if len(self.retired) == len(self.fleet):
            raise EngineError(f"every worker failed {MAX_CONSECUTIVE_FAILURES} jobs in a row; "
                              f"last error: {error}")
        if self.writer:
            self.writer.commit()

    # -- bookkeeping ----------------------------------------------------------
    def _log_intervals(self, rows) -> None:
        if self.writer:
            self.writer.add_intervals(rows)

    def _close_timeline(self) -> None:
        """At the end: free workers were idle until now; jobs in flight are cut at now."""
        end = self.clock.now
        rows = [(w, IntervalKind.IDLE, t, end, self.version, None)
                for w, t in sorted(self.free_since.items())]
        for job_id, f in sorted(self.in_flight.items()):
            t0, tm, w = f.t_dispatch, f.timing, f.job.worker
            a, b = t0 + tm.download, t0 + tm.download + tm.compute
            rows += [(w, IntervalKind.DOWNLOAD, t0, min(a, end), f.job.base_version, job_id),
                     (w, IntervalKind.COMPUTE, min(a, end), min(b, end), f.job.base_version,
                      job_id),
                     (w, IntervalKind.UPLOAD, min(b, end), end, f.job.base_version, job_id)]
        self._log_intervals(rows)
        if self.writer:
            self.writer.commit()

    _last_eval_version = -1

    def _evaluate(self) -> None:
        self._last_eval_version = self.version
        if self.evaluate is None:
            return
        ev = self.evaluate(self.params)
        self.last_perplexity = ev.perplexity
        if self.writer:
            self.writer.add_metric(version=self.version, virtual_time=self.clock.now,
                                   wall_time=time.time() - self.wall_start, tokens=self.tokens,
                                   jobs=self.jobs_done, loss=ev.loss, perplexity=ev.perplexity,
                                   bits_per_byte=ev.bits_per_byte)
            self.writer.commit()
        self._report()

    def _report(self) -> None:
        if self.progress:
            self.progress(Progress(self.version, self.cfg.updates, self.clock.now,
                                   self.jobs_done, self.tokens, self.last_perplexity))
