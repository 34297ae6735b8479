"""Asynchronous strategies: every finished job goes through the strategy's chain.

No barrier: a free worker always gets a job with the current global model, so
workers never wait for each other; the price is staleness s = (global version
now) − (version the job started from), which each strategy may use.

An async strategy is its chain of transforms (``chain_for``) and nothing else:
each arriving outer gradient runs through it, and a step that comes out is
descended at once; a transform may hold the gradient (a buffer) or drop it
(too stale), and then the model does not change.

Learning-rate scale: a single worker's outer gradient g enters as g/N (N =
number of workers), so N arrivals at outer lr ε move the model about as far
as one synchronous round at ε. This is the scale of the delayed-Nesterov
paper's Algorithm 3, and makes ε comparable across sync and async.
"""

from __future__ import annotations

from typing import Any

from fedlm.strategies import transforms as T
from fedlm.strategies.base import Strategy, Update, check_outer_sgd, momentum_text


class AsyncStrategy(Strategy):
    """Runs each arriving outer gradient through ``chain_for(N)``; by default
    g · staleness_weight(s)/N, then outer SGD. Subclasses override either."""

    synchronous = False

    def __init__(self, *, lr: float, momentum: float = 0.0, nesterov: bool = False) -> None:
        check_outer_sgd(lr, momentum)
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.num_workers = 0
        self.optimizer: T.Transform | None = None
        self.opt_state: Any = None
        self.applied = 0  # steps descended

    def staleness_weight(self, staleness: int) -> float | None:
        """Multiplier of an update with this staleness; None drops it."""
        return 1.0

    def chain_for(self, num_workers: int) -> T.Transform:
        """The strategy's transforms, once the number of workers N is known."""
        return T.chain(T.weight_by_staleness(self.staleness_weight, divide_by=num_workers),
                       T.sgd(self.lr, self.momentum, self.nesterov))

    @property
    def dropped(self) -> int:
        """Updates the chain dropped (e.g. too stale)."""
        return sum(T.find(self.opt_state, "dropped"))

    def start(self, params, *, num_workers: int) -> None:
        self.num_workers = num_workers
        self.optimizer = self.chain_for(num_workers)
        self.opt_state = self.optimizer.init(params)

    def wants_job(self, worker: int, *, version: int) -> bool:
        return True

    def on_update(self, update: Update, params):
        step, self.opt_state = self.optimizer.update(update.outer_grad, self.opt_state, update)
        if step is None:
            return None  # held or dropped
        self.applied += 1
        return T.descend(params, step)

    def state_dict(self) -> dict[str, Any]:
        return {"opt_state": self.opt_state, "num_workers": self.num_workers,
                "applied": self.applied}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.num_workers = state["num_workers"]
        self.optimizer = self.chain_for(self.num_workers)
        self.opt_state = state["opt_state"]
        self.applied = state["applied"]

    def summary(self) -> str:
        mom = momentum_text(self.momentum, self.nesterov)
        return f"{self.name}: async, outer lr {self.lr}{mom}"
