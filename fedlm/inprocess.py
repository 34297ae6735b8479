"""An in-process transport: runs each job with ``worker.run_job`` in this process.

Used by tests that exercise the engine without Flower, and by replay. It keeps
each worker's inner-optimizer state the way a Flower node keeps it in
``context.state``. ``arrival_seed`` shuffles the order replies come back in, to
show that the engine's result does not depend on it.
"""

from __future__ import annotations

import time

import numpy as np

from fedlm.config import Config
from fedlm.engine import Reply
from fedlm.worker import JobSpec, run_job


class InProcessTransport:
    def __init__(self, cfg: Config, arrival_seed: int | None = None) -> None:
        self.cfg = cfg
        self.opt_states: dict[int, dict] = {}
        self.ready: list[Reply] = []
        self.rng = np.random.default_rng(arrival_seed) if arrival_seed is not None else None

    def submit(self, job: JobSpec, params) -> None:
        result = run_job(params, self.opt_states.get(job.worker, {}), job, self.cfg)
        self.opt_states[job.worker] = result.opt_state
        self.ready.append(Reply(job.job_id, result.outer_grad, result.steps, result.tokens,
                                result.train_loss, result.compute_seconds,
                                wall_arrival=time.time()))

    def collect(self, timeout: float) -> list[Reply]:
        replies, self.ready = self.ready, []
        if self.rng is not None:
            replies = [replies[i] for i in self.rng.permutation(len(replies))]
        return replies
