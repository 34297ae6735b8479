"""DiLoCo: synchronous Local-SGD with an outer Nesterov optimizer.

Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
Models", 2023, https://arxiv.org/abs/2311.08105

The paper's setting — Nesterov momentum 0.9, outer lr 0.7 — is the default.
With lr 1.0 and momentum 0 it is exactly FedAvg (a unit test pins this).
"""

from __future__ import annotations

from fedlm.strategies.fedavg import FedAvg


class DiLoCo(FedAvg):
    """FedAvg rounds with DiLoCo's outer Nesterov optimizer (see FedAvg for parameters)."""

    source = ("follows Douillard et al. 2023 (arXiv 2311.08105): outer Nesterov, lr 0.7, "
              "momentum 0.9, updates weighted by tokens")

    name = "diloco"

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True,
                 weighting: str = "tokens", min_replies: int = 1, **sampling) -> None:
        super().__init__(lr=lr, momentum=momentum, nesterov=nesterov, weighting=weighting,
                         min_replies=min_replies, **sampling)
