"""Flower's FedOpt family as fedlm plug-ins: FedAvg's rounds with another outer optimizer
(``FedAvg.outer_optimizer``), a few lines each.

Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv 2003.00295, Algorithm 2
(FedAdagrad, FedAdam, FedYogi), and Hsu et al. 2019, arXiv 1909.06335 (FedAvgM: server
momentum). A round's merged outer gradient g = θ − mean θ_i (fedlm's sign: Reddi's Δ is
−g) goes through ``transforms.adaptive`` and a step of η; Flower's defaults (its
``flwr.serverapp.strategy`` classes): η 0.1 (FedYogi 0.01), β₁ 0.9, β₂ 0.99, τ 1e-3;
FedAvgM's momentum 0.9, Hsu et al.'s (Flower's default, 0, is plain FedAvg).

    PYTHONPATH=examples fedlm run --set strategy=fedopt:FedAdam --set model=tiny
"""

from fedlm.strategies import transforms as T
from fedlm.strategies.fedavg import FedAvg

SOURCE = ("follows Reddi et al. 2021 (arXiv 2003.00295), Alg. 2, and Hsu et al. 2019: "
          "Flower's defaults; v starts at tau^2 and no bias correction, as the paper")


class FedAvgM(FedAvg):
    """FedAvg with server momentum (heavy ball): v <- beta v + g, x <- x - lr v."""

    name = "fedavgm"
    source = SOURCE

    def __init__(self, *, lr: float = 1.0, momentum: float = 0.9, **rounds) -> None:
        super().__init__(lr=lr, momentum=momentum, nesterov=False, **rounds)


class FedAdam(FedAvg):
    """FedAvg rounds whose merged outer gradient goes through Adam (Reddi et al. 2021)."""

    name = "fedadam"
    source = SOURCE
    second = "adam"

    def __init__(self, *, lr: float = 0.1, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3, **rounds) -> None:
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1 and tau > 0):
            raise ValueError(f"outer.beta1, beta2 in [0, 1) and tau > 0, got {beta1!r}, "
                             f"{beta2!r}, {tau!r}")
        self.beta1, self.beta2, self.tau = beta1, beta2, tau
        super().__init__(lr=lr, **rounds)

    def outer_optimizer(self) -> T.Transform:
        return T.chain(T.adaptive(self.second, self.beta1, self.beta2, self.tau),
                       T.scale(self.lr))

    def outer_summary(self) -> str:
        return (f"outer {self.second} lr {self.lr}, betas ({self.beta1}, {self.beta2}), "
                f"tau {self.tau}")


class FedYogi(FedAdam):
    """FedAdam with Yogi's additive second moment: v <- v - (1-b2) g^2 sign(v - g^2)."""

    name = "fedyogi"
    second = "yogi"

    def __init__(self, *, lr: float = 0.01, **rest) -> None:
        super().__init__(lr=lr, **rest)


class FedAdagrad(FedAdam):
    """FedAdam with Adagrad's second moment (v <- v + g^2) and no first moment (beta1 0)."""

    name = "fedadagrad"
    second = "adagrad"

    def __init__(self, *, beta1: float = 0.0, **rest) -> None:
        super().__init__(beta1=beta1, **rest)
