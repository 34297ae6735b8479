"""Pairwise gossip with the server as a fedlm plug-in strategy, written from
docs/strategies.md alone (in the spirit of gossip averaging, Boyd et al. 2006).

Asynchronous. Each arriving job forms a pair with the server: the worker's model
θ_w = θ_base − g (the model its job started from, minus its outer gradient) and
the current global model θ are averaged with weight ``outer.weight`` = w (½: a
plain pairwise average):

    θ ← (1 − w)·θ + w·θ_w

For a fresh update (θ_base = θ) this is θ − w·g; for a stale one the worker's
model, not its gradient, is mixed in, so the server keeps the model each job
started from (a past model, saved in the checkpoint). Lost jobs change nothing.
(Not ``outer.mix``: fedlm reads that old name as ``stream.mix``.)

    PYTHONPATH=examples fedlm run --backend inprocess --set model=tiny \\
        --set strategy=gossip_pairs:GossipPairs --set outer.weight=0.5
"""

from fedlm.strategies import transforms as T
from fedlm.strategies.base import Strategy

SOURCE = ("fedlm's own: a pairwise average with the server, in the spirit of gossip (Boyd "
          "et al. 2006)")


class GossipPairs(Strategy):
    """Average each arriving worker's model with the global model at weight ``weight``."""

    name = "gossip-pairs"
    source = SOURCE
    synchronous = False

    def __init__(self, *, weight: float = 0.5) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"outer.weight: must be in (0, 1], got {weight!r}")
        self.weight = weight
        self.current = None  # the global model as this strategy last returned it
        self.starts: dict = {}  # worker -> the global model its outstanding job started from
        self.applied = 0

    def start(self, params, *, num_workers: int) -> None:
        self.current = T.tree_map(lambda p: p.clone(), params)

    def wants_job(self, worker: int, *, version: int) -> bool:
        return True  # async: a free worker always gets a job

    def on_dispatch(self, worker: int, *, version: int) -> None:
        self.starts[worker] = self.current

    def on_update(self, update, params):
        base = self.starts.pop(update.worker)
        m = self.weight
        new = T.tree_map(lambda th, b, g: (1 - m) * th + m * (b - g),
                         params, base, update.outer_grad)
        self.current = new
        self.applied += 1
        return new

    def on_job_lost(self, worker: int, *, job_id: int, reason: str, params):
        self.starts.pop(worker, None)
        return None

    def state_dict(self) -> dict:
        return {"current": self.current, "applied": self.applied,
                "starts": {w: self.starts[w] for w in sorted(self.starts)}}

    def load_state_dict(self, state: dict) -> None:
        self.current, self.applied = state["current"], state["applied"]
        self.starts = dict(state["starts"])

    def summary(self) -> str:
        return (f"gossip-pairs: async, each arrival averaged with the global model at weight "
                f"{self.weight}")
