"""An in-process transport: runs each job with ``worker.serve_job`` in this process.

Used by ``fedlm run --backend inprocess`` and by tests that exercise the engine
without Flower. Each worker's optimizer states live in memory (on a GPU, in
device memory between its jobs), or on disk as a Flower node keeps them
(``fedlm.worker.states``). ``arrival_seed`` shuffles the order replies come back
in, to show that the engine's result does not depend on it.

``sim.job_threads = k`` runs up to k jobs at once, each in a thread of a
pool with its own scratch model and, on CUDA, its own stream, so the jobs of
several simulated workers share one GPU (or, on a CPU, several cores). With
several GPUs (``sim.devices``, ``fedlm.worker.placement``) worker w's jobs run on GPU
w mod N, with k threads per GPU, and the server on the first. A job computes
the same bits in any thread and on any device of one kind: what it reads is
fixed by its message, and the engine orders replies by the virtual clock, not
by arrival.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, wait

import numpy as np

from fedlm.worker import placement, precision
from fedlm.config import Config
from fedlm.job import JobResult, JobSpec
from fedlm.worker.states import DiskStates, MemoryStates, worker_states
from fedlm.worker.train import serve_job


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
        self.running: dict[Future, int] = {}  # job thread -> its job id

    def _states(self, worker: int):
        if worker not in self.states:
            self.states[worker] = worker_states(self.cfg, self.run_key, worker)
        return self.states[worker]

    def _serve(self, job: JobSpec, params, states, device: str) -> JobResult:
        try:
            with precision.job_stream(device):
                result = serve_job(params, states, job, self.cfg,
                                   server_device=self.server_device, device=device)
        except Exception as exc:  # as a crashed ClientApp: an error reply
            return JobResult.failed(job.job_id, f"{type(exc).__name__}: {exc}", time.time())
        return result.arrived(time.time())

    def submit(self, job: JobSpec, params) -> None:
        # The engine never changes a model version's tensors once made (strategies
        # return new ones), so a job thread may read ``params`` while the engine
        # goes on; a worker's next job is only sent after this one's reply.
        states = self._states(job.worker)
        at = placement.device_of(job.worker, len(self.devices))
        if self.pools is None:
            self.ready.append(self._serve(job, params, states, self.devices[at]))
        else:
            fut = self.pools[at].submit(self._serve, job, params, states, self.devices[at])
            self.running[fut] = job.job_id

    def collect(self, timeout: float) -> list[JobResult]:
        if self.running:  # wait for a job thread only while nothing is ready yet
            done, _ = wait(list(self.running), timeout=0 if self.ready else timeout,
                           return_when=FIRST_COMPLETED)
            # Several at once: by job id, so a run on the wall clock sees a stable order.
            for fut in sorted(done, key=self.running.__getitem__):
                del self.running[fut]
                self.ready.append(fut.result())
        replies, self.ready = self.ready, []
        if self.rng is not None:
            replies = [replies[i] for i in self.rng.permutation(len(replies))]
        return replies

    def close(self) -> None:
        """Wait for the jobs still running (a thread cannot be stopped) and end the pool;
        jobs not started yet are dropped."""
        for pool in self.pools or []:
            pool.shutdown(wait=True, cancel_futures=True)
        self.running.clear()
