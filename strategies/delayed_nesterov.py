"""Delayed Nesterov (DN): the asynchronous outer optimizer of

Liu et al., "Asynchronous Local-SGD Training for Language Modeling", 2024,
https://arxiv.org/abs/2401.09135, Algorithm 3.

Every arriving outer gradient moves the model at once (g/N), but the momentum
is updated only once per N arrivals, from their average: so momentum sees the
same averaged signal as synchronous DiLoCo and does not decay N times too fast.
The formula lives in ``transforms.delayed_nesterov``.
"""

from __future__ import annotations

from fedlm.strategies import transforms as T
from fedlm.strategies.async_base import AsyncStrategy


class DelayedNesterov(AsyncStrategy):
    """Delayed Nesterov momentum with buffer N and mixing coefficient c.

    Parameters
    ----------
    lr : float
        Outer learning rate ε.
    momentum : float
        Nesterov momentum β.
    buffer_size : int
        N, arrivals per momentum update; 0 = the number of workers.
    c : float
        In [0, 1/N]: how much of the momentum is applied between momentum
        updates (0 = none, the paper's default).
    """

    source = ("follows Liu et al. 2024 (arXiv 2401.09135), Algorithm 3 (buffer N, c, beta, "
              "lr as the paper writes them); chosen here: N = the worker count by default "
              "(the paper tried 4, 8, 16)")

    name = "delayed-nesterov"
    # The momentum step comes at every N-th arrival: workers that restart before it
    # train from a point the model then leaves (fedlm/engine/grace.py).
    wants_grace = True

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, buffer_size: int = 0,
                 c: float = 0.0) -> None:
        super().__init__(lr=lr, momentum=momentum, nesterov=True)
        if buffer_size < 0:
            raise ValueError(f"outer.buffer_size: must be >= 0, got {buffer_size!r}")
        if c < 0:
            raise ValueError(f"outer.c: must be >= 0, got {c!r}")
        self.buffer_size, self.c = buffer_size, c

    @property
    def n(self) -> int:
        return self.buffer_size or self.num_workers

    def chain_for(self, num_workers: int) -> T.Transform:
        # No staleness weighting: DN's transform divides by N itself (g/N).
        n = self.buffer_size or num_workers
        return T.chain(T.delayed_nesterov(self.momentum, n, self.c), T.scale(self.lr))

    def summary(self) -> str:
        return (f"{self.name}: async, outer lr {self.lr}, momentum {self.momentum}, "
                f"N {self.n or 'workers'}, c {self.c}")
