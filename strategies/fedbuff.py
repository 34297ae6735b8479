"""FedBuff: buffered asynchronous aggregation.

Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
AISTATS 2022, https://arxiv.org/abs/2106.06639 — clients run asynchronously;
the server buffers K updates, each scaled by 1/√(1 + s), and then takes one
outer-optimizer step on their average. The delayed-Nesterov paper's "Async
Buffer" baseline is this with a Nesterov outer step and K = N.
"""

from __future__ import annotations

import math

from fedlm.strategies import transforms as T
from fedlm.strategies.async_base import AsyncStrategy


class FedBuff(AsyncStrategy):
    """Average K staleness-scaled updates, then one outer (Nesterov) step.

    Parameters
    ----------
    lr : float
        Outer learning rate ε.
    momentum : float
        Nesterov momentum β of the outer step (0: plain SGD).
    buffer_size : int
        K, updates per outer step; 0 = the number of workers.
    """

    source = ("follows Nguyen et al. 2022 (arXiv 2106.06639): K buffered updates scaled by "
              "1/sqrt(1 + s); a Nesterov outer step as Liu et al. 2024's Async Buffer")

    name = "fedbuff"

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, buffer_size: int = 0) -> None:
        super().__init__(lr=lr, momentum=momentum, nesterov=momentum > 0)
        if buffer_size < 0:
            raise ValueError(f"outer.buffer_size: must be >= 0, got {buffer_size!r}")
        self.buffer_size = buffer_size

    @property
    def k(self) -> int:
        return self.buffer_size or self.num_workers

    @property
    def buffer(self) -> list:
        """The scaled updates waiting for the next outer step, oldest first."""
        return next(T.find(self.opt_state, "buffer"), [])

    def staleness_weight(self, staleness: int) -> float | None:
        return 1.0 / math.sqrt(1.0 + staleness)

    def chain_for(self, num_workers: int) -> T.Transform:
        # The average over the buffer replaces the async scale 1/N.
        return T.chain(T.weight_by_staleness(self.staleness_weight, divide_by=1),
                       T.buffer(self.buffer_size or num_workers),
                       T.sgd(self.lr, self.momentum, self.nesterov))

    def summary(self) -> str:
        return f"{super().summary()}, buffer K {self.k or 'workers'}, weight 1/sqrt(1+s)"
