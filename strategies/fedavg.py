"""Synchronous FedAvg / Local-SGD with a pluggable outer optimizer.

McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017, https://arxiv.org/abs/1602.05629

Each round every worker starts from the same global model; when the last one
has reported (the barrier), the round's outer gradients are averaged —
weighted by tokens, in worker order so the float sums are reproducible — and
the outer optimizer takes one step. With SGD at lr 1.0 the new model is exactly
the average of the workers' models.

Who takes part in a round, when it closes, and what becomes of lost and late replies
is the round's bookkeeping (``fedlm.strategies.rounds.Rounds``: client sampling,
``min_replies``, ``late``); this class is its merge and its outer step.

Streaming DiLoCo (``stream.fragments``, ``stream.overlap``, ``stream.mix``) is not
this class's business: its server (``fedlm.servers.streamed``) gives each fragment
an instance of the strategy of its own, which sees only that fragment's tensors
(optax's ``multi_transform``, by fragment).
"""

from __future__ import annotations

from typing import Any

from fedlm.strategies import transforms as T
from fedlm.strategies.base import Update, check_outer_sgd, momentum_text
from fedlm.strategies.rounds import Synchronous

WEIGHTINGS = ("tokens", "uniform", "fednova")  # how a round's outer gradients are merged


class FedAvg(Synchronous):
    """Synchronous rounds; outer SGD (optionally with Nesterov momentum).

    Parameters
    ----------
    lr : float
        Outer learning rate ε. 1.0 is plain model averaging.
    momentum : float
        Outer momentum β; 0 disables it.
    nesterov : bool
        Nesterov momentum (as in DiLoCo) rather than heavy ball.
    weighting : {"tokens", "uniform", "fednova"}
        How the round's outer gradients are averaged: by the tokens each trained, each
        alike, or FedNova's normalisation by local steps (``transforms.normalized_mean``:
        for rounds whose jobs ran different numbers of steps).
    min_replies, fraction, min_workers, sample_by, overcommit, late
        The rounds (``fedlm.strategies.rounds.Synchronous``): the fewest replies a round
        may close with after workers dropped out of it; client sampling
        (``fedlm.strategies.sampling``): a round takes max(min_workers, floor(fraction ·
        N)) of the N workers available, drawn uniformly or by data, dispatching
        ``overcommit`` times as many and keeping the first to report; the others'
        replies are dropped, or with ``late = "next"`` merged into the next round. The
        defaults (1, 1, 1, uniform, 1, drop): every worker, every round.
    """

    source = ("follows McMahan et al. 2017 (FedAvg: outer SGD, lr 1 = the average), "
              "Nesterov outer momentum as an option")

    name = "fedavg"

    def __init__(self, *, lr: float = 1.0, momentum: float = 0.0, nesterov: bool = False,
                 weighting: str = "tokens", **rounds: Any) -> None:
        check_outer_sgd(lr, momentum)
        if weighting not in WEIGHTINGS:
            raise ValueError(f"outer.weighting: must be tokens, uniform or fednova, "
                             f"got {weighting!r}")
        super().__init__(**rounds)
        self.lr, self.momentum, self.nesterov, self.weighting = lr, momentum, nesterov, weighting
        self.optimizer = self.outer_optimizer()
        self.opt_state: Any = None

    def outer_optimizer(self) -> T.Transform:
        """What turns a round's merged outer gradient into its step: the seam a
        subclass overrides for another outer optimizer (FedAdam: a few lines, the round
        bookkeeping untouched). Called once, at the end of ``__init__``."""
        return T.sgd(self.lr, self.momentum, self.nesterov)

    def start(self, params, *, num_workers: int) -> None:
        self.opt_state = self.optimizer.init(params)

    def close(self, replies: list[Update], params):
        step, self.opt_state = self.optimizer.update(self.merge(replies), self.opt_state, None)
        return T.descend(params, step)

    def merge(self, replies: list[Update]):
        """The round's outer gradients as one, by ``weighting`` (summed in their order)."""
        grads = [u.outer_grad for u in replies]
        if self.weighting == "fednova" and all(u.local_steps > 0 for u in replies):
            return T.normalized_mean(grads, [u.local_steps for u in replies])
        weights = [float(u.tokens) if self.weighting == "tokens" else 1.0 for u in replies]
        if not sum(weights):  # a streaming run's last rounds train no token
            weights = [1.0] * len(replies)
        return T.weighted_mean(grads, weights)

    def state_dict(self) -> dict[str, Any]:
        return {"opt_state": self.opt_state, **super().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.opt_state = state["opt_state"]

    def summary(self) -> str:
        """One line of its settings; a subclass with another outer optimizer says its own
        (``outer_summary``), not outer SGD's."""
        s = self.rounds.sampling
        drawn = (f", rounds of {s.fraction:g} of the workers (at least {s.min_workers}, "
                 f"{s.sample_by}, overcommit {s.overcommit:g}, late replies {s.late})"
                 if s.active else "")
        return (f"{self.name}: sync rounds{drawn}, {self.outer_summary()}, weighting "
                f"{self.weighting}")

    def outer_summary(self) -> str:
        return f"outer SGD lr {self.lr}{momentum_text(self.momentum, self.nesterov)}"
