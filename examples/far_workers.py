"""Delayed Nesterov with a merge built for far workers, as a fedlm plug-in: each arrival
normalised by its steps, weighted down by its age, dropped when too late.

Sized to their own round trips (`local_steps = fill-sizes`, or `dylu-rtt`), the workers of
a wide-area fleet send updates of very different sizes and ages: a near, fast worker many
small fresh ones, a far one few large stale ones. Delayed Nesterov (Liu et al. 2024)
treats every arrival alike. This merge, before DN's buffer, takes from the literature
the three ways it names to absorb them:

    g ← g · H / s          FedNova (Wang et al. 2020): an update of s inner steps counts
                           as one of the reference H (``normalize``)
    g ← g / √(1 + τ)       a staleness-aware step (FedBuff's 1/√(1 + s)), τ the update's
                           age in rounds of N arrivals: τ = s_versions / N (``decay``)
    g dropped if τ > R     Ringmaster ASGD (Maranjyan et al. 2025): an update older than
                           R rounds is discarded (``max_age``; 0: none is)

each a setting (``outer.normalize``, ``outer.decay``, ``outer.max_age``), so an ablation
switches one off at a time. fedlm's own combination: no paper runs these three together
on delayed Nesterov, and none sizes asynchronous Local-SGD jobs by round trip.

    PYTHONPATH=examples fedlm run --set strategy=far_workers:FarDN \\
        --set local_steps=fill-sizes --set profile=halos --set workers=8
"""

from __future__ import annotations

import math

from fedlm.strategies import transforms as T
from fedlm.strategies.delayed_nesterov import DelayedNesterov

SOURCE = ("fedlm's own: delayed Nesterov (Liu et al. 2024) behind FedNova's step "
          "normalisation, a 1/sqrt(1 + age) weight and Ringmaster's drop of late updates")


def far_merge(steps: int, workers: int, normalize: bool, decay: bool,
              max_age: float) -> T.Transform:
    """Each arrival normalised by its steps, weighted by its age, or dropped."""

    def init(params):
        return {"dropped": 0}

    def update(grads, state, info):
        if info is None:
            return grads, state
        age = info.staleness / workers  # in rounds of N arrivals
        if max_age and age > max_age:
            return None, {"dropped": state["dropped"] + 1}
        w = steps / info.local_steps if normalize and info.local_steps > 0 else 1.0
        w = w / math.sqrt(1.0 + age) if decay else w
        return T.tree_map(lambda g: g * w, grads), state

    return T.Transform(init, update)


class FarDN(DelayedNesterov):
    """Delayed Nesterov behind a step-normalised, age-weighted merge that drops late updates."""

    name = "far-dn"
    source = SOURCE

    def __init__(self, *, normalize: bool = True, decay: bool = True, max_age: float = 2.0,
                 **dn) -> None:
        if max_age < 0:
            raise ValueError(f"outer.max_age: must be >= 0 (rounds; 0: none dropped), got "
                             f"{max_age!r}")
        super().__init__(**dn)
        self.normalize, self.decay, self.max_age = normalize, decay, max_age
        self.steps = 0  # the reference H: the run's inner.steps, told through on_fleet

    def on_fleet(self, facts) -> None:
        self.steps = facts.inner_steps

    def chain_for(self, num_workers: int) -> T.Transform:
        merge = far_merge(self.steps or 1, num_workers, self.normalize, self.decay,
                          self.max_age)
        return T.chain(merge, super().chain_for(num_workers))

    def summary(self) -> str:
        parts = [p for p, on in (("steps normalised", self.normalize),
                                 ("1/sqrt(1 + age)", self.decay)) if on]
        drop = f", dropped past {self.max_age:g} rounds" if self.max_age else ""
        return f"{super().summary()}; merge: {', '.join(parts) or 'plain'}{drop}"
