"""FedBuff: buffered asynchronous aggregation.

Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
AISTATS 2022, https://arxiv.org/abs/2106.06639 — clients run asynchronously;
the server buffers K updates, each scaled by 1/√(1 + s), and then takes one
outer-optimizer step on their average. The delayed-Nesterov paper's "Async
Buffer" baseline is this with a Nesterov outer step and K = N.
"""

from __future__ import annotations

import math
from typing import Any

from fedlm.strategies import transforms as T
from fedlm.strategies.async_base import AsyncStrategy, scale_tree
from fedlm.strategies.base import Update
from fedlm.strategies.transforms import weighted_mean


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

    name = "fedbuff"

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, buffer_size: int = 0) -> None:
        super().__init__(lr=lr, momentum=momentum, nesterov=momentum > 0)
        if buffer_size < 0:
            raise ValueError(f"outer.buffer_size: must be >= 0, got {buffer_size!r}")
        self.buffer_size = buffer_size
        self.buffer: list[Any] = []

    @property
    def k(self) -> int:
        return self.buffer_size or self.num_workers

    def staleness_weight(self, staleness: int) -> float | None:
        return 1.0 / math.sqrt(1.0 + staleness)

    def on_update(self, update: Update, params):
        self.buffer.append(scale_tree(update.outer_grad, self.staleness_weight(update.staleness)))
        if len(self.buffer) < self.k:
            return None
        mean = weighted_mean(self.buffer, [1.0] * len(self.buffer))  # FIFO order
        self.buffer = []
        step, self.opt_state = self.optimizer.update(mean, self.opt_state)
        self.applied += 1
        return T.descend(params, step)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "buffer": list(self.buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.buffer = list(state["buffer"])

    def summary(self) -> str:
        return f"{super().summary()}, buffer K {self.k}, weight 1/sqrt(1+s)"
