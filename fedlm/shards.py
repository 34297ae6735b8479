"""Data shards as the server sees them: which shard a job trains, and how far
each shard (and the whole run) has got.

The training data is split into ``data.shards`` shards (``fedlm.data.partition``).
With ``data.shard_choice = fixed`` worker w always trains shard w (one shard per
worker). With ``paper`` a free worker draws the shard it trains next, as in the
delayed-Nesterov paper (Liu et al. 2024, "we sample a data shard only when it is
under-sampled"): shard i with probability

    p_i ∝ max(|D_i| / Σ|D| − n_i / Σn, 0)

where |D_i| is the shard's size and n_i the sequences already handed out from
it. Before anything was handed out (Σn = 0), and in the rare state where no
shard is under-sampled, p_i ∝ |D_i|.

Progress is counted when a job is dispatched (a job lost later still counts):
that is what makes a shard's schedule position, and the draw itself, known at
dispatch, so they are written to the job's row and replay reads them back
instead of drawing again. Each shard's position (its ``cursor``: inner steps
handed out from it so far) drives ``inner.schedule = shard``; the sum over
shards drives ``global``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from fedlm import data
from fedlm.config import Config, DataConfig
from fedlm.job import JobSpec
from fedlm.sim import fleet


def paper_weights(sizes, consumed) -> np.ndarray:
    """The paper's shard-choice probabilities for shard sizes |D_i| and sequences
    consumed n_i (closed form; see the module docstring)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    consumed = np.asarray(consumed, dtype=np.float64)
    share = sizes / sizes.sum()
    if consumed.sum() > 0:
        deficit = np.maximum(share - consumed / consumed.sum(), 0.0)
        if deficit.sum() > 0:
            return deficit / deficit.sum()
    return share


class ShardBook:
    """Per-shard progress and the seeded shard draw; part of the engine's state."""

    def __init__(self, sizes: list[int], choice: str, seed: int) -> None:
        if choice not in ("fixed", "paper"):
            raise ValueError(f"shard choice: must be fixed or paper, got {choice!r}")
        self.sizes = [int(s) for s in sizes]
        self.choice = choice
        self.consumed = [0] * len(sizes)  # sequences handed out per shard (n_i)
        self.steps = [0] * len(sizes)  # inner steps handed out per shard (its cursor)
        self._rng = np.random.default_rng([seed, 32452843])

    @property
    def total_steps(self) -> int:
        return sum(self.steps)

    def pick(self, worker: int) -> int:
        """The shard the free ``worker``'s next job trains."""
        if self.choice == "fixed":
            return worker
        p = paper_weights(self.sizes, self.consumed)
        return int(self._rng.choice(len(p), p=p))

    def take(self, shard: int, steps: int, sequences: int) -> tuple[int, int]:
        """Hand ``steps`` inner steps (``sequences`` sequences) of ``shard`` to a job.
        Returns where the shard and the run stood before: ``(cursor, run steps)``."""
        before = (self.steps[shard], self.total_steps)
        self.steps[shard] += steps
        self.consumed[shard] += sequences
        return before

    def state_dict(self) -> dict:
        return {"consumed": list(self.consumed), "steps": list(self.steps),
                "rng": self._rng.bit_generator.state}

    def load_state_dict(self, st: dict) -> None:
        self.consumed, self.steps = list(st["consumed"]), list(st["steps"])
        self._rng.bit_generator.state = st["rng"]


# -- the shards' sequences, per process (read-only caches) -----------------------

@lru_cache(maxsize=4)
def data_shards(data_cfg: DataConfig, num_shards: int, seed: int) -> tuple[np.ndarray, ...]:
    corpus = data.load_corpus(data_cfg)
    return tuple(data.partition(corpus, data_cfg, num_shards, seed))


def node_shard(cfg: Config, node: int) -> np.ndarray:
    """The sequences a node trains on with ``data.shard_choice = fixed``: its
    worker's shard, or (hierarchical) the shards of every worker in its region's pod."""
    shards = data_shards(cfg.data, cfg.shard_count(), cfg.seed)
    members = fleet.groups(cfg)[node] if cfg.network.hierarchical else [node]
    return shards[members[0]] if len(members) == 1 else np.concatenate(
        [shards[w] for w in members])


def job_data(cfg: Config, job: JobSpec) -> np.ndarray:
    """The sequences ``job`` samples its batches from."""
    if cfg.data.shard_choice == "fixed" or job.shard < 0:
        return node_shard(cfg, job.worker)
    return data_shards(cfg.data, cfg.shard_count(), cfg.seed)[job.shard]


def shard_sizes(cfg: Config) -> list[int]:
    """Sequences in each shard the server hands out (``ShardBook``): one per node
    with ``fixed``, ``data.shards`` with ``paper``."""
    if cfg.data.shard_choice == "fixed":
        return [len(node_shard(cfg, n)) for n in range(fleet.node_count(cfg))]
    return [len(s) for s in data_shards(cfg.data, cfg.shard_count(), cfg.seed)]


def pod_size(cfg: Config, node: int) -> int:
    """Workers training as one data-parallel pod on ``node`` (1 unless hierarchical)."""
    return len(fleet.groups(cfg)[node]) if cfg.network.hierarchical else 1
