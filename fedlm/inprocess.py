"""An in-process transport: runs each job with ``worker.serve_job`` in this process.

Used by ``fedlm run --backend inprocess`` and by tests that exercise the engine
without Flower. Each worker's optimizer states live in memory (on a GPU, in
device memory between its jobs), or on disk as a Flower node keeps them
(``fedlm.worker.states``), written behind the jobs by one writer thread
(``fedlm.worker.state_writer``) and flushed before each checkpoint.
``arrival_seed`` shuffles the order replies come back in, to show that the
engine's result does not depend on it.

``sim.job_threads = k`` runs up to k jobs at once, each in a thread of a
pool with its own scratch model and, on CUDA, its own stream, so the jobs of
several simulated workers share one GPU (or, on a CPU, several cores). With
several GPUs (``sim.devices``, ``fedlm.worker.placement``) worker w's jobs run on GPU
w mod N, with k threads per GPU, and the server on the first. A job computes
the same bits in any thread and on any device of one kind: what it reads is
fixed by its message, and the engine orders replies by the virtual clock, not
by arrival.

``sim.batched`` (``fedlm.worker.batching``): the jobs submitted since the last
``collect`` wait there and are trained together, as one computation per group of
equal shapes (``fedlm.worker.batched``; split over the pool's threads if there is
a pool); the jobs it does not take run as above.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import NamedTuple

import numpy as np

from fedlm.worker import batched, batching, placement, precision
from fedlm.config import Config
from fedlm.job import JobResult, JobSpec
from fedlm.worker.state_writer import StateWriter
from fedlm.worker.states import DiskStates, MemoryStates, worker_states
from fedlm.worker.train import serve_job


class Pending(NamedTuple):
    """A job waiting to be trained with the others submitted before the next collect."""

    job: JobSpec
    params: object
    states: object


class InProcessTransport:
    def __init__(self, cfg: Config, arrival_seed: int | None = None,
                 run_key: str | None = None) -> None:
        self.cfg = cfg
        self.run_key = run_key or uuid.uuid4().hex  # names its disk states
        self.states: dict[int, MemoryStates | DiskStates] = {}
        self.ready: list[JobResult] = []
        self.rng = np.random.default_rng(arrival_seed) if arrival_seed is not None else None
        self.devices = placement.devices(cfg)
        # the engine keeps the global model, the outer step and each update on the run's
        # (first) device (fedlm.runner): nothing crosses to the host per job but the
        # store's digest
        self.server_device = self.devices[0]
        self.pools = placement.job_pools(self.devices, cfg.sim.job_threads)
        self.running: dict[Future, int] = {}  # job thread -> its (first) job id
        self.batched = batching.resolve(cfg)
        self.pending: list[Pending] = []  # batched: jobs submitted since the last collect
        # disk states are written behind the jobs; flushed before each checkpoint
        self.writer = StateWriter() if cfg.state_store() == "disk" else None

    def _states(self, worker: int):
        if worker not in self.states:
            self.states[worker] = worker_states(self.cfg, self.run_key, worker,
                                                writer=self.writer)
        return self.states[worker]

    def flush_states(self) -> None:
        """Every worker state saved so far on disk (a checkpoint's states must be)."""
        if self.writer is not None:
            self.writer.flush()

    def _serve(self, job: JobSpec, params, states, device: str) -> JobResult:
        try:
            with precision.job_stream(device):
                result = serve_job(params, states, job, self.cfg,
                                   server_device=self.server_device, device=device)
        except Exception as exc:  # as a crashed ClientApp: an error reply
            return _failed(job, exc)
        return result.arrived(time.time())

    def _serve_one(self, job: JobSpec, params, states, device: str) -> list[JobResult]:
        return [self._serve(job, params, states, device)]

    def submit(self, job: JobSpec, params) -> None:
        # The engine never changes a model version's tensors once made (strategies
        # return new ones), so a job thread may read ``params`` while the engine
        # goes on; a worker's next job is only sent after this one's reply.
        states = self._states(job.worker)
        if self.batched and batching.batchable(job):
            self.pending.append(Pending(job, params, states))  # trained in collect
            return
        at = placement.device_of(job.worker, len(self.devices))
        if self.pools is None:
            self.ready.append(self._serve(job, params, states, self.devices[at]))
        else:
            fut = self.pools[at].submit(self._serve_one, job, params, states, self.devices[at])
            self.running[fut] = job.job_id

    def _serve_group(self, group: list[Pending], device: str) -> list[JobResult]:
        """Jobs trained together (``worker.batched``), each loading and saving its own
        worker's state as ``serve_job`` does; a job whose state cannot be loaded, or
        every job of a computation that raised, gets an error reply."""
        replies, loaded = [], []
        for p in group:
            try:
                loaded.append((p, p.states.load(p.job.prev_job)))
            except Exception as exc:
                replies.append(_failed(p.job, exc))
        try:
            with precision.job_stream(device):
                trained = batched.job_updates(
                    [(p.params, state, p.job) for p, state in loaded], self.cfg,
                    state_on_device=getattr(group[0].states, "device_resident", False),
                    server_device=self.server_device, device=device)
        except Exception as exc:  # as a crashed ClientApp, for each of them
            return replies + [_failed(p.job, exc) for p, _ in loaded]
        for (p, _), (result, new_state) in zip(loaded, trained):
            p.states.save(p.job.job_id, new_state)
            p.states.prune(p.job.keep_from)
            replies.append(result.arrived(time.time()))
        return replies

    def _start_pending(self) -> None:
        """The jobs submitted since the last collect, trained in groups of equal shapes
        on each worker's device (as one job would be: ``placement.device_of``), a
        device's group split over its job threads."""
        pending, self.pending = self.pending, []
        n = len(self.devices)
        for at in range(n):
            mine = [p for p in pending if placement.device_of(p.job.worker, n) == at]
            for group in batching.groups(mine, lambda job: batched.group_key(self.cfg, job)):
                if self.pools is None:
                    self.ready.extend(self._serve_group(group, self.devices[at]))
                    continue
                for part in batching.split(group, self.cfg.sim.job_threads):
                    fut = self.pools[at].submit(self._serve_group, part, self.devices[at])
                    self.running[fut] = part[0].job.job_id

    def collect(self, timeout: float) -> list[JobResult]:
        if self.pending:
            self._start_pending()
        if self.running:  # wait for a job thread only while nothing is ready yet
            done, _ = wait(list(self.running), timeout=0 if self.ready else timeout,
                           return_when=FIRST_COMPLETED)
            # Several at once: by job id, so a run on the wall clock sees a stable order.
            for fut in sorted(done, key=self.running.__getitem__):
                del self.running[fut]
                self.ready.extend(fut.result())
        replies, self.ready = self.ready, []
        if self.rng is not None:
            replies = [replies[i] for i in self.rng.permutation(len(replies))]
        return replies

    def close(self) -> None:
        """Wait for the jobs still running (a thread cannot be stopped) and end the pools;
        jobs not started yet are dropped."""
        self.pending.clear()
        for pool in self.pools or []:
            pool.shutdown(wait=True, cancel_futures=True)
        self.running.clear()
        if self.writer is not None:  # before the run's states folder may go
            self.writer.close()


def _failed(job: JobSpec, exc: Exception) -> JobResult:
    return JobResult.failed(job.job_id, f"{type(exc).__name__}: {exc}", time.time())
