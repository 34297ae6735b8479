"""Async SGD: outer SGD applied to every arriving outer gradient.

With H = 1 local step this is classic parameter-server asynchronous SGD
(Dean et al. 2012); with H > 1 it is asynchronous Local-SGD.
"""

from __future__ import annotations

from fedlm.strategies.async_base import AsyncStrategy


class AsyncSGD(AsyncStrategy):
    """θ ← θ − ε·g/N for each arriving g.

    Parameters
    ----------
    lr : float
        Outer learning rate ε (1.0: N arrivals move as far as a FedAvg round).
    """

    source = ("follows Liu et al. 2024 (arXiv 2401.09135): the plain asynchronous baseline, "
              "each arrival one SGD step of lr/N")

    name = "async-sgd"

    def __init__(self, *, lr: float = 1.0) -> None:
        super().__init__(lr=lr)
