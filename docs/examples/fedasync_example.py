"""FedAsync as a fedlm plug-in strategy (Xie et al. 2019, arXiv 1903.03934).

    x ← (1 − α_s)·x + α_s·x_new,   α_s = α·(1 + s)^−a,   x_new = θ_base − g
"""

from collections import OrderedDict

from fedlm.strategies.base import Strategy


class FedAsync(Strategy):
    """FedAsync: mix each worker's model into the global one, staleness-weighted."""

    name = "fedasync"

    def __init__(self, *, alpha: float = 0.6, a: float = 0.5, keep: int = 64) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"outer.alpha: must be in (0, 1], got {alpha!r}")
        self.alpha, self.a, self.keep = alpha, a, keep
        self.versions: dict = {}  # version -> model a worker may have started from
        self.version = 0

    def start(self, params, *, num_workers: int) -> None:
        self.versions = {0: params}

    def wants_job(self, worker: int, *, version: int) -> bool:
        return True  # asynchronous: a free worker always gets a job

    def on_update(self, update, params):
        base = self.versions.get(update.base_version, params)
        alpha = self.alpha * (1 + update.staleness) ** -self.a
        new = OrderedDict((k, (1 - alpha) * params[k] + alpha * (base[k] - update.outer_grad[k]))
                          for k in params)
        self.version += 1
        self.versions[self.version] = new
        self.versions.pop(self.version - self.keep, None)  # bounded memory
        return new

    def state_dict(self) -> dict:
        return {"versions": dict(self.versions), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.versions, self.version = dict(state["versions"]), state["version"]

    def summary(self) -> str:
        return f"fedasync: alpha {self.alpha}, weight (1+s)^-{self.a}"
