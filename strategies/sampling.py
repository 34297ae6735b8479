"""Client sampling for synchronous rounds, as FedAvg, Flower and FedScale define it.

A round takes K of the workers available when it opens (McMahan et al. 2017's C: a
fraction of the clients; Flower's ``fraction_train`` and ``min_train_nodes``):

    K = min(N, max(min_workers, floor(fraction · N)))      N: workers available now

and dispatches D = min(N, ceil(K · overcommit)) of them (FedScale's over-commitment,
1.3 in its benchmarks), keeping the first K to report; the others' updates, arriving
after the round closed, are dropped (their compute is waste). The D are drawn without
replacement, uniformly or with probability proportional to each worker's data
(``sample_by = "data"``: its shard's sequences, where shards are the workers' own),
from a generator seeded by the run's seed and the round: a run, its replay and its
resume draw the same workers, whatever was drawn before. With ``late = "next"`` a reply
that comes after its round closed is merged into the round open then instead (a
semi-synchronous round: it closes at a quorum, its stragglers' work is not lost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SAMPLE_BY = ("uniform", "data")
LATE = ("drop", "next")


@dataclass(frozen=True)
class Sampling:
    """A synchronous strategy's sampling settings (``outer.*``)."""

    fraction: float = 1.0  # of the available workers a round takes (Flower: fraction_train)
    min_workers: int = 1  # a round takes at least this many (Flower: min_train_nodes)
    sample_by: str = "uniform"  # uniform | data (proportional to each worker's sequences)
    overcommit: float = 1.0  # dispatch ceil(K x overcommit), keep the first K to report
    late: str = "drop"  # a reply after its round closed: drop | next (merged into the next)

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"outer.fraction: must be in (0, 1], got {self.fraction!r}")
        if not (isinstance(self.min_workers, int) and self.min_workers >= 1):
            raise ValueError(f"outer.min_workers: must be an int >= 1, got "
                             f"{self.min_workers!r}")
        if self.sample_by not in SAMPLE_BY:
            raise ValueError(f"outer.sample_by: uniform or data, got {self.sample_by!r}")
        if not 1 <= self.overcommit <= 10:
            raise ValueError(f"outer.overcommit: must be in [1, 10], got {self.overcommit!r}")
        if self.late not in LATE:
            raise ValueError(f"outer.late: drop or next, got {self.late!r}")
        if self.min_workers > 1 and not self.active:  # every worker takes part anyway
            raise ValueError(f"outer.min_workers: counts a drawn round's workers, and "
                             f"rounds are drawn only with outer.fraction < 1 or "
                             f"outer.overcommit > 1, got {self.min_workers!r}")

    @property
    def active(self) -> bool:
        """Whether rounds are drawn at all (else every worker takes part, as ever)."""
        return self.fraction < 1 or self.overcommit > 1

    def sizes(self, available: int) -> tuple[int, int]:
        """(K kept, D dispatched) of a round that opens with ``available`` workers."""
        keep = min(available, max(self.min_workers, math.floor(self.fraction * available)))
        return keep, min(available, math.ceil(keep * self.overcommit - 1e-9))

    def draw(self, workers: list[int], seed: int, round_key: tuple[int, ...],
             data: list[int] | None) -> tuple[list[int], int]:
        """(the workers dispatched, K) for a round opening with ``workers`` available."""
        keep, dispatch = self.sizes(len(workers))
        rng = np.random.default_rng([seed, 52813, *round_key])
        weights = None
        if self.sample_by == "data" and data is not None:
            sizes = np.array([max(0, data[w]) if w < len(data) else 0 for w in workers], float)
            weights = sizes / sizes.sum() if sizes.sum() > 0 else None
        if weights is not None and np.count_nonzero(weights) < dispatch:
            weights = None  # too few with data for a draw without replacement: uniform
        chosen = rng.choice(len(workers), size=dispatch, replace=False, p=weights)
        return sorted(workers[i] for i in chosen), keep
