"""Async Nesterov: Nesterov applied to every arriving outer gradient.

The delayed-Nesterov paper's naive baseline ("Async DiLoCo"; Liu et al. 2024,
https://arxiv.org/abs/2401.09135, Section 4): treating N workers'
contributions as N sequential momentum steps makes the momentum decay N times
as fast while the parameter step is amplified. Kept as the baseline it is.
"""

from __future__ import annotations

from fedlm.strategies.async_base import AsyncStrategy


class AsyncNesterov(AsyncStrategy):
    """m ← β·m + g/N;  θ ← θ − ε·(β·m + g/N) for each arriving g.

    Parameters
    ----------
    lr : float
        Outer learning rate ε.
    momentum : float
        Nesterov momentum β.
    """

    source = ("follows Liu et al. 2024 (arXiv 2401.09135): \"Async DiLoCo\", Nesterov applied "
              "to every arrival")

    name = "async-nesterov"

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9) -> None:
        super().__init__(lr=lr, momentum=momentum, nesterov=True)
