"""Polynomial staleness weighting (FedAsync-style), on top of async Nesterov.

Xie et al., "Asynchronous Federated Optimization", 2019,
https://arxiv.org/abs/1903.03934 — the weight w(s) = (1 + s)^−a; the
delayed-Nesterov paper's "Poly" and "PolyThres" baselines apply it to async
DiLoCo. ``momentum=0`` gives the plain FedAsync-style polynomial SGD.
"""

from __future__ import annotations

from fedlm.strategies.async_base import AsyncStrategy


class Poly(AsyncStrategy):
    """Scale each outer gradient by (1 + s)^−a, then async Nesterov.

    Parameters
    ----------
    lr : float
        Outer learning rate ε.
    momentum : float
        Nesterov momentum β (0: plain SGD).
    a : float
        Exponent of the polynomial decay (0.5 is common).
    """

    source = ("follows Liu et al. 2024's Poly baseline (FedAsync's polynomial weight, a = "
              "0.5) on async Nesterov")

    name = "poly"

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, a: float = 0.5) -> None:
        super().__init__(lr=lr, momentum=momentum, nesterov=momentum > 0)
        if a < 0:
            raise ValueError(f"outer.a: must be >= 0, got {a!r}")
        self.a = a

    def staleness_weight(self, staleness: int) -> float | None:
        return (1.0 + staleness) ** -self.a

    def summary(self) -> str:
        return f"{super().summary()}, weight (1+s)^-{self.a}"


class PolyThres(Poly):
    """Poly, and drop updates staler than ``threshold``.

    Parameters
    ----------
    lr, momentum, a : see Poly.
    threshold : int
        Largest staleness still applied (the paper uses 10).
    """

    source = "follows Liu et al. 2024's PolyThres baseline: Poly, updates staler than 10 dropped"

    name = "polythres"

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, a: float = 0.5,
                 threshold: int = 10) -> None:
        super().__init__(lr=lr, momentum=momentum, a=a)
        if threshold < 0:
            raise ValueError(f"outer.threshold: must be >= 0, got {threshold!r}")
        self.threshold = threshold

    def staleness_weight(self, staleness: int) -> float | None:
        return None if staleness > self.threshold else super().staleness_weight(staleness)

    def summary(self) -> str:
        return f"{super().summary()}, drop s > {self.threshold}"
