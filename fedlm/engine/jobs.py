"""What a new job is: its number, the data it trains (seed, shard, schedule
position), the fault it is to act out, and how long it may take.

All of it is decided at dispatch, from seeded draws that depend only on the
worker and its job count (``data_seed``, ``fedlm.faults``) or on the shards'
progress (``fedlm.shards``), and written to the job's row, so replay reads it
back instead of drawing again.
"""

from __future__ import annotations

import numpy as np

from fedlm import shards
from fedlm.config import Config
from fedlm.job import JobSpec
from fedlm.shards import ShardBook
from fedlm.sim import faults
from fedlm.sim.fleet import JobTiming, WorkerProfile


class _RunShards(ShardBook):
    """``ShardBook`` with the run's total steps kept as jobs take them: ``ShardBook``
    sums every shard's steps at each job, which made a dispatch O(shards), and there
    is a shard per worker by default. The same numbers and the same state; the count
    belongs in ``fedlm.shards`` itself once that module has settled where it lives."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._total = sum(self.steps)

    @property
    def total_steps(self) -> int:
        return self._total

    def take(self, shard: int, steps: int, sequences: int) -> tuple[int, int]:
        before = super().take(shard, steps, sequences)
        self._total += steps
        return before

    def load_state_dict(self, st: dict) -> None:
        super().load_state_dict(st)
        self._total = sum(self.steps)


def data_seed(seed: int, worker: int, job_index: int) -> int:
    """The data seed of a worker's k-th job: independent of other workers' jobs."""
    return int(np.random.SeedSequence([seed, 104729, worker, job_index]).generate_state(1)[0])


class JobMaker:
    def __init__(self, cfg: Config, fleet: list[WorkerProfile],
                 shard_sizes: list[int] | None = None) -> None:
        self.cfg = cfg
        self.fleet = fleet
        # Only the paper's shard draw reads the shards' sizes (default: loaded from cfg).
        if shard_sizes is None:
            shard_sizes = (shards.shard_sizes(cfg) if cfg.data.shard_choice == "paper"
                           else [1] * len(fleet))
        self.shards = _RunShards(shard_sizes, cfg.data.shard_choice, cfg.seed)
        self._sequences_per_step = [cfg.inner.batch_size * p.members for p in fleet]
        self.next_job_id = 0

    def make(self, w: int, *, version: int, steps: int, index: int, prev_job: int,
             keep_from: int) -> JobSpec:
        """Worker ``w``'s ``index``-th job: ``steps`` inner steps from global ``version``,
        starting from the optimizer state of job ``prev_job``."""
        fault = faults.draw(self.cfg, w, index)
        shard = self.shards.pick(w)
        cursor, run_steps = self.shards.take(shard, steps, steps * self._sequences_per_step[w])
        schedule_step = {"worker": -1, "shard": cursor,
                         "global": run_steps}[self.cfg.inner.schedule]
        job = JobSpec(self.next_job_id, w, version, steps, data_seed(self.cfg.seed, w, index),
                      prev_job=prev_job, keep_from=keep_from, fault=fault, shard=shard,
                      cursor=cursor, schedule_step=schedule_step)
        self.next_job_id += 1
        return job

    def time_allowed(self, job: JobSpec, timing: JobTiming | None) -> float:
        """Seconds a job may take: configured, or a multiple of its nominal virtual time."""
        r = self.cfg.reliability
        if r.deadline > 0:
            return r.deadline
        if timing is None:  # wall clock without a configured deadline
            return self.cfg.sim.reply_timeout
        nominal = (timing.download + job.local_steps * self.fleet[job.worker].step_time
                   + timing.upload + timing.exchange)
        return r.deadline_factor * nominal

    def state_dict(self) -> dict:
        return {"next_job_id": self.next_job_id, "shards": self.shards.state_dict()}

    def load_state_dict(self, st: dict) -> None:
        self.next_job_id = st["next_job_id"]
        self.shards.load_state_dict(st["shards"])
