"""Trimmed-mean FedAvg as a fedlm plug-in strategy (Yin et al. 2018, arXiv 1803.01498).

Synchronous rounds. At the barrier each coordinate of the round's outer gradients
drops its ``trim`` largest and ``trim`` smallest values and averages the rest, so a
few bad workers cannot pull the model far; then the outer optimizer steps.
"""

import torch

from fedlm.strategies import transforms as T
from fedlm.strategies.base import check_outer_sgd
from fedlm.strategies.rounds import Synchronous

SOURCE = "follows Yin et al. 2018 (arXiv 1803.01498): the coordinate-wise trimmed mean"


class TrimmedMean(Synchronous):
    """FedAvg rounds on the coordinate-wise trimmed mean of the outer gradients."""

    name = "trimmed-mean"
    source = SOURCE

    def __init__(self, *, lr: float = 1.0, trim: int = 1) -> None:
        check_outer_sgd(lr, 0.0)
        if trim < 0:
            raise ValueError(f"outer.trim: must be >= 0, got {trim!r}")
        super().__init__()  # the rounds: every worker, every round
        self.lr, self.trim = lr, trim
        self.optimizer = T.sgd(lr)
        self.opt_state = None

    def start(self, params, *, num_workers: int) -> None:
        self.opt_state = self.optimizer.init(params)

    def close(self, replies, params):
        grads = [u.outer_grad for u in replies]  # in worker order: reproducible
        t = min(self.trim, (len(grads) - 1) // 2)
        mean = T.tree_map(lambda *g: torch.stack(g).sort(dim=0).values[t:len(g) - t].mean(0),
                          *grads)
        step, self.opt_state = self.optimizer.update(mean, self.opt_state, None)
        return T.descend(params, step)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "opt_state": self.opt_state}  # the round's, and its own

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.opt_state = state["opt_state"]

    def summary(self) -> str:
        return f"trimmed-mean: sync rounds, outer SGD lr {self.lr}, trim {self.trim}"
