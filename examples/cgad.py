"""CGAD (Cosine-Gated Adam-Decay) as a fedlm plug-in: an asynchronous outer Adam whose
every arriving outer gradient is scaled by a weight of its age before it enters Adam's
moments.

Source: Shah and Sun (FLock.io), "Cosine-Gated Adam-Decay: Drop-In Staleness-Aware Outer
Optimization for Decoupled DiLoCo", arXiv 2605.09126, 2026. Its abstract gives the rule:
each pseudo-gradient of age τ is scaled by σ(τ) = γ(τ)·e^(−ατ) before Adam's first and
second moments; the exponential models information decay, the cosine gate γ smoothly
zeroes contributions past a chosen cutoff; at τ = 0 it is plain Adam. The gate's exact
form and the defaults were not in what could be read here (the abstract), so this file
takes the half cosine that is 1 at τ = 0 and reaches 0 at the cutoff τ_c, and its own
defaults:

    σ(τ) = γ(τ)·e^(−α·τ),   γ(τ) = ½(1 + cos(π·τ/τ_c)) for τ < τ_c, else 0
    g̃ = σ(τ)·g                                τ = the update's staleness (versions)
    m ← β₁m + (1 − β₁)·g̃;   v ← β₂v + (1 − β₂)·g̃²;   t ← t + 1
    θ ← θ − η · (m / (1 − β₁ᵗ)) / (√(v / (1 − β₂ᵗ)) + ε)

α = ``outer.alpha`` (0.1), τ_c = ``outer.cutoff`` (10), η = ``outer.lr`` (0.003),
β₁, β₂ = ``outer.beta1``/``beta2`` (0.9, 0.99), ε = 1e-8. An update past the cutoff still
counts a step (its σ is 0: the moments decay and the model moves along m), as the rule
reads. No 1/N: Adam's step does not grow with the gradient's scale.

Simplified: one gate for the whole model (not the paper's per-fragment PA-CGAD).

    PYTHONPATH=examples fedlm run --set strategy=cgad:CGAD --set model=tiny --set profile=very
"""

from __future__ import annotations

import math

from fedlm.strategies import transforms as T
from fedlm.strategies.async_base import AsyncStrategy

EPS = 1e-8


def age_weight(staleness: int, alpha: float, cutoff: float) -> float:
    """σ(τ) = γ(τ)·e^(−ατ): exponential decay under a cosine gate that closes at τ_c."""
    if staleness >= cutoff:
        return 0.0
    gate = 0.5 * (1.0 + math.cos(math.pi * staleness / cutoff))
    return gate * math.exp(-alpha * staleness)


def gated_adam(lr: float, beta1: float, beta2: float, alpha: float,
               cutoff: float) -> T.Transform:
    """Adam on σ(staleness)·g, with bias correction."""

    def init(params):
        zeros = T.tree_map(lambda p: p.new_zeros(p.shape), params)
        return {"m": zeros, "v": zeros, "t": 0}

    def update(grads, state, info):
        w = age_weight(info.staleness if info is not None else 0, alpha, cutoff)
        m = T.tree_map(lambda m, g: beta1 * m + (1 - beta1) * (w * g), state["m"], grads)
        v = T.tree_map(lambda v, g: beta2 * v + (1 - beta2) * (w * g) ** 2, state["v"], grads)
        t = state["t"] + 1
        c1, c2 = 1 - beta1 ** t, 1 - beta2 ** t
        step = T.tree_map(lambda m, v: lr * (m / c1) / ((v / c2).sqrt() + EPS), m, v)
        return step, {"m": m, "v": v, "t": t}

    return T.Transform(init, update)


class CGAD(AsyncStrategy):
    """Async outer Adam on age-weighted outer gradients: σ(τ) = γ(τ)·e^(−ατ)."""

    name = "cgad"

    def __init__(self, *, lr: float = 0.003, beta1: float = 0.9, beta2: float = 0.99,
                 alpha: float = 0.1, cutoff: float = 10.0) -> None:
        super().__init__(lr=lr)
        for key, value in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= value < 1:
                raise ValueError(f"outer.{key}: must be in [0, 1), got {value!r}")
        if alpha < 0:
            raise ValueError(f"outer.alpha: must be >= 0, got {alpha!r}")
        if cutoff <= 0:
            raise ValueError(f"outer.cutoff: must be > 0 (versions), got {cutoff!r}")
        self.beta1, self.beta2, self.alpha, self.cutoff = beta1, beta2, alpha, cutoff

    def chain_for(self, num_workers: int) -> T.Transform:
        return gated_adam(self.lr, self.beta1, self.beta2, self.alpha, self.cutoff)

    def summary(self) -> str:
        return (f"{self.name}: async outer Adam lr {self.lr} betas ({self.beta1}, "
                f"{self.beta2}), age weight e^(-{self.alpha} s) gated to 0 at s = "
                f"{self.cutoff}")
