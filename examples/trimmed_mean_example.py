"""Trimmed-mean FedAvg as a fedlm plug-in strategy (Yin et al. 2018, arXiv 1803.01498).

Synchronous rounds. At the barrier each coordinate of the round's outer gradients
drops its ``trim`` largest and ``trim`` smallest values and averages the rest, so a
few bad workers cannot pull the model far; then the outer optimizer steps.
"""

import torch

from fedlm.strategies import transforms as T
from fedlm.strategies.base import Strategy, check_outer_sgd

SOURCE = "follows Yin et al. 2018 (arXiv 1803.01498): the coordinate-wise trimmed mean"


class TrimmedMean(Strategy):
    """FedAvg rounds on the coordinate-wise trimmed mean of the outer gradients."""

    name = "trimmed-mean"
    source = SOURCE
    synchronous = True

    def __init__(self, *, lr: float = 1.0, trim: int = 1) -> None:
        check_outer_sgd(lr, 0.0)
        if trim < 0:
            raise ValueError(f"outer.trim: must be >= 0, got {trim!r}")
        self.lr, self.trim = lr, trim
        self.optimizer = T.sgd(lr)
        self.opt_state = None
        self.running: set = set()  # workers whose job of this round is outstanding
        self.out: set = set()  # workers out of this round (missed the deadline, retired)
        self.grads: dict = {}  # worker -> outer gradient of this round

    def start(self, params, *, num_workers: int) -> None:
        self.opt_state = self.optimizer.init(params)

    def wants_job(self, worker: int, *, version: int) -> bool:
        return not (worker in self.running or worker in self.out or worker in self.grads)

    def on_dispatch(self, worker: int, *, version: int) -> None:
        self.running.add(worker)

    def on_update(self, update, params):
        self.running.discard(update.worker)
        self.grads[update.worker] = update.outer_grad
        return self._close(params)

    def on_job_lost(self, worker: int, *, job_id: int, reason: str, params):
        self.running.discard(worker)
        if reason in ("error", "rejected"):
            return None  # the worker is free and takes the round's job again
        self.out.add(worker)  # "deadline", "retired": out of this round
        return self._close(params)  # the last outstanding job: the round closes now

    def _close(self, params):
        if self.running:
            return None  # the barrier: wait for the round's other jobs
        if not self.grads:  # every job of the round was lost: start it over
            self.out.clear()
            return None
        grads = [self.grads[w] for w in sorted(self.grads)]  # worker order: reproducible
        t = min(self.trim, (len(grads) - 1) // 2)
        mean = T.tree_map(lambda *g: torch.stack(g).sort(dim=0).values[t:len(g) - t].mean(0),
                          *grads)
        step, self.opt_state = self.optimizer.update(mean, self.opt_state, None)
        self.grads, self.out = {}, set()
        return T.descend(params, step)

    def state_dict(self) -> dict:
        return {"opt_state": self.opt_state, "running": sorted(self.running),
                "out": sorted(self.out), "grads": dict(self.grads)}

    def load_state_dict(self, state: dict) -> None:
        self.opt_state, self.grads = state["opt_state"], dict(state["grads"])
        self.running, self.out = set(state["running"]), set(state["out"])

    def summary(self) -> str:
        return f"trimmed-mean: sync rounds, outer SGD lr {self.lr}, trim {self.trim}"
