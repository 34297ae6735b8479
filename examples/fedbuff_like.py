"""A FedBuff-like asynchronous strategy as a fedlm plug-in (Nguyen et al. 2022,
arXiv 2106.06639), written from docs/strategies.md alone.

The server buffers K arriving outer gradients and, once K are in, applies their
plain mean (oldest first) with a server learning rate η:

    θ ← θ − η · mean(g_1, ..., g_K)

No staleness weighting and no momentum (fedlm's built-in ``fedbuff`` has both).
``outer.k`` = 0 (the default) means K = N, the number of workers.

    PYTHONPATH=examples fedlm run --backend inprocess --set model=tiny \\
        --set strategy=fedbuff_like:FedBuffLike --set outer.k=2 --set outer.lr=1.0
"""

from fedlm.strategies import transforms as T
from fedlm.strategies.async_base import AsyncStrategy

SOURCE = ("reconstruction of Nguyen et al. 2022 (arXiv 2106.06639) without its staleness "
          "scale: a plug-in example, fedlm's fedbuff has it")


class FedBuffLike(AsyncStrategy):
    """Buffer K outer gradients, then descend on their mean scaled by the server lr."""

    name = "fedbuff-like"
    source = SOURCE

    def __init__(self, *, lr: float = 1.0, k: int = 0) -> None:
        if not lr > 0:
            raise ValueError(f"outer.lr: must be > 0, got {lr!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"outer.k: must be an integer >= 0 (0: the number of workers), "
                             f"got {k!r}")
        super().__init__(lr=lr)
        self.lr, self.k = lr, k

    def chain_for(self, num_workers: int) -> T.Transform:
        # No division by N: the buffer's mean already stands for one round.
        return T.chain(T.buffer(self.k or num_workers), T.scale(self.lr))

    def summary(self) -> str:
        k = self.k or "N (workers)"
        return f"fedbuff-like: async, buffer K={k}, mean then outer SGD lr {self.lr}"
