"""An in-process transport: runs each job with ``worker.serve_job`` in this process.

Used by ``fedlm run --backend inprocess`` and by tests that exercise the engine
without Flower. Each worker's optimizer states live in memory, or on disk as a
Flower node keeps them (``fedlm.worker_state``). ``arrival_seed`` shuffles the order replies come back in, to
show that the engine's result does not depend on it.
"""

from __future__ import annotations

import time
import uuid

import numpy as np

from fedlm.config import Config
from fedlm.engine import Reply
from fedlm.worker import JobSpec, serve_job
from fedlm.worker_state import DiskStates, MemoryStates, disk_folder


class InProcessTransport:
    def __init__(self, cfg: Config, arrival_seed: int | None = None,
                 run_key: str | None = None) -> None:
        self.cfg = cfg
        self.run_key = run_key or uuid.uuid4().hex  # names its disk states
        self.states: dict[int, MemoryStates | DiskStates] = {}
        self.ready: list[Reply] = []
        self.rng = np.random.default_rng(arrival_seed) if arrival_seed is not None else None

    def _states(self, worker: int):
        if worker not in self.states:
            self.states[worker] = (DiskStates(disk_folder(self.run_key, worker))
                                   if self.cfg.state_store() == "disk" else MemoryStates())
        return self.states[worker]

    def submit(self, job: JobSpec, params) -> None:
        try:
            result = serve_job(params, self._states(job.worker), job, self.cfg)
        except Exception as exc:  # as a crashed ClientApp: an error reply
            self.ready.append(Reply(job.job_id, None, error=f"{type(exc).__name__}: {exc}",
                                    wall_arrival=time.time()))
            return
        self.ready.append(Reply(job.job_id, result.outer_grad, result.steps, result.tokens,
                                result.train_loss, result.compute_seconds,
                                wall_arrival=time.time()))

    def collect(self, timeout: float) -> list[Reply]:
        replies, self.ready = self.ready, []
        if self.rng is not None:
            replies = [replies[i] for i in self.rng.permutation(len(replies))]
        return replies
