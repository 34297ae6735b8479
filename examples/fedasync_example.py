"""FedAsync as a fedlm plug-in strategy, built as a chain (Xie et al. 2019,
arXiv 1903.03934): each arriving outer gradient g is applied at once, weighted
by the "hinge" staleness function, and one staler than ``max_staleness`` is dropped:

    θ ← θ − α·w(s)·g,   w(s) = 1 if s <= b else 1 / (a·(s − b) + 1)
"""

from fedlm.strategies import transforms as T
from fedlm.strategies.async_base import AsyncStrategy

SOURCE = ("follows Xie et al. 2019 (arXiv 1903.03934): the hinge staleness weight; fedlm's: "
          "alpha 0.6, a 10, b 4 and the drop past 64 versions")


class FedAsync(AsyncStrategy):
    """FedAsync: apply each arriving outer gradient at once, hinge-weighted by staleness."""

    name = "fedasync"
    source = SOURCE

    def __init__(self, *, alpha: float = 0.6, a: float = 10.0, b: int = 4,
                 max_staleness: int = 64) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"outer.alpha: must be in (0, 1], got {alpha!r}")
        if not 0 <= a < float("inf"):  # a < 0 makes weights negative, or divides by zero
            raise ValueError(f"outer.a: must be >= 0, got {a!r}")
        for key, value in (("b", b), ("max_staleness", max_staleness)):
            if value < 0:  # max_staleness < 0 would drop every update: a stalled run
                raise ValueError(f"outer.{key}: must be >= 0 versions, got {value!r}")
        super().__init__(lr=alpha)
        self.alpha, self.a, self.b, self.max_staleness = alpha, a, b, max_staleness

    def staleness_weight(self, staleness: int) -> float | None:
        if staleness > self.max_staleness:
            return None  # too stale: dropped (counted in self.dropped)
        return 1.0 if staleness <= self.b else 1.0 / (self.a * (staleness - self.b) + 1.0)

    def chain_for(self, num_workers: int) -> T.Transform:
        # Mixing rate α per arrival, not the async default α/N.
        return T.chain(T.weight_by_staleness(self.staleness_weight, divide_by=1),
                       T.scale(self.alpha))

    def summary(self) -> str:
        return (f"fedasync: async, alpha {self.alpha}, hinge a {self.a} b {self.b}, "
                f"drop s > {self.max_staleness}")
