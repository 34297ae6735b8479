"""Asynchronous strategies: every finished job is applied at once.

No barrier: a free worker always gets a job with the current global model, so
workers never wait for each other; the price is staleness s = (global version
now) − (version the job started from), which each strategy may use.

Learning-rate scale: a single worker's outer gradient g enters as g/N (N =
number of workers), so N arrivals at outer lr ε move the model about as far
as one synchronous round at ε. This is the scale of the delayed-Nesterov
paper's Algorithm 3, and makes ε comparable across sync and async.
"""

from __future__ import annotations

from typing import Any

from fedlm.strategies import transforms as T
from fedlm.strategies.base import Strategy, Update


def scale_tree(tree, factor: float):
    return type(tree)((k, v * factor) for k, v in tree.items())


class AsyncStrategy(Strategy):
    """Applies ``optimizer`` to each arriving outer gradient, scaled by
    ``staleness_weight(s) / N``. Subclasses choose the optimizer and the weight."""

    synchronous = False

    def __init__(self, *, lr: float, momentum: float = 0.0, nesterov: bool = False) -> None:
        if lr <= 0:
            raise ValueError(f"outer.lr: must be > 0, got {lr!r}")
        if not 0 <= momentum < 1:
            raise ValueError(f"outer.momentum: must be in [0, 1), got {momentum!r}")
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.num_workers = 0
        self.optimizer: T.Transform | None = None
        self.opt_state: Any = None
        self.applied = 0
        self.dropped = 0

    def make_optimizer(self) -> T.Transform:
        return T.sgd(self.lr, self.momentum, self.nesterov)

    def staleness_weight(self, staleness: int) -> float | None:
        """Multiplier of an update with this staleness; None drops it."""
        return 1.0

    def start(self, params, *, num_workers: int) -> None:
        self.num_workers = num_workers
        self.optimizer = self.make_optimizer()
        self.opt_state = self.optimizer.init(params)

    def wants_job(self, worker: int, *, version: int) -> bool:
        return True

    def on_update(self, update: Update, params):
        weight = self.staleness_weight(update.staleness)
        if weight is None:
            self.dropped += 1
            return None
        g = scale_tree(update.outer_grad, weight / self.num_workers)
        step, self.opt_state = self.optimizer.update(g, self.opt_state)
        self.applied += 1
        return T.descend(params, step)

    def state_dict(self) -> dict[str, Any]:
        return {"opt_state": self.opt_state, "num_workers": self.num_workers,
                "applied": self.applied, "dropped": self.dropped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.num_workers = state["num_workers"]
        self.optimizer = self.make_optimizer()
        self.opt_state = state["opt_state"]
        self.applied, self.dropped = state["applied"], state["dropped"]

    def summary(self) -> str:
        mom = f", momentum {self.momentum}{' nesterov' if self.nesterov else ''}" \
            if self.momentum else ""
        return f"{self.name}: async, outer lr {self.lr}{mom}"

