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
    g̃ = σ(τ)·g                                τ = s / N: the update's age in outer rounds
    m ← β₁m + (1 − β₁)·g̃;   v ← β₂v + (1 − β₂)·g̃²;   t ← t + 1
    θ ← θ − (η/N) · (m / (1 − β₁ᵗ)) / (√(v / (1 − β₂ᵗ)) + ε)

The paper counts an update's age in **outer rounds** ("pseudo-gradients computed several
outer rounds earlier"), as its syncer merges a round at a time, and steps Adam once a
round. fedlm's asynchronous server makes a version at every arrival and its N workers
arrive about once each per round, so the age is the staleness s (versions) over N, and
each arrival takes 1/N of an Adam step: N arrivals move the model as one round's step.
(Counting versions as rounds, as this file once did, weighted a typical update of 8
workers about 10x down and zeroed every one 10 arrivals old.)

What the paper's abstract does not give, and is fedlm's choice: the gate's form (the
half cosine above, 1 at τ = 0 and 0 at τ_c), α = ``outer.alpha`` (0.1), τ_c =
``outer.cutoff`` (10 rounds), η = ``outer.lr`` (0.003), β₁, β₂ = ``outer.beta1``/``beta2``
(0.9, 0.99), ε = 1e-8, a continuous τ (not rounded to whole rounds), and that an update
past the cutoff still counts a step (its σ is 0: the moments decay and the model moves
along m). What the paper fixes and a test pins: σ(0) = 1, so a fresh update is plain
Adam's (tests/test_cgad.py).

Simplified: one gate for the whole model (not the paper's per-fragment PA-CGAD).

    PYTHONPATH=examples fedlm run --set strategy=cgad:CGAD --set model=tiny --set profile=very
"""

from __future__ import annotations

import math

from fedlm.strategies import transforms as T
from fedlm.strategies.async_base import AsyncStrategy

EPS = 1e-8

SOURCE = ("reconstruction of Shah and Sun 2026 (arXiv 2605.09126, abstract only): age in "
          "outer rounds (staleness / N) and one Adam step a round (lr / N an arrival) as "
          "the paper; the gate's form and every constant fedlm's")


def age_weight(age: float, alpha: float, cutoff: float) -> float:
    """σ(τ) = γ(τ)·e^(−ατ): exponential decay under a cosine gate that closes at τ_c
    (τ in outer rounds)."""
    if age >= cutoff:
        return 0.0
    gate = 0.5 * (1.0 + math.cos(math.pi * age / cutoff))
    return gate * math.exp(-alpha * age)


def gated_adam(lr: float, beta1: float, beta2: float, alpha: float,
               cutoff: float, workers: int = 1) -> T.Transform:
    """Adam on σ(staleness / workers)·g, with bias correction, lr / workers a step."""

    def init(params):
        zeros = T.tree_map(lambda p: p.new_zeros(p.shape), params)
        return {"m": zeros, "v": zeros, "t": 0}

    def update(grads, state, info):
        w = age_weight((info.staleness if info is not None else 0) / workers, alpha, cutoff)
        m = T.tree_map(lambda m, g: beta1 * m + (1 - beta1) * (w * g), state["m"], grads)
        v = T.tree_map(lambda v, g: beta2 * v + (1 - beta2) * (w * g) ** 2, state["v"], grads)
        t = state["t"] + 1
        c1, c2 = 1 - beta1 ** t, 1 - beta2 ** t
        step = T.tree_map(lambda m, v: lr / workers * (m / c1) / ((v / c2).sqrt() + EPS),
                          m, v)
        return step, {"m": m, "v": v, "t": t}

    return T.Transform(init, update)


class CGAD(AsyncStrategy):
    """Async outer Adam on age-weighted outer gradients: σ(τ) = γ(τ)·e^(−ατ)."""

    name = "cgad"
    source = SOURCE

    def __init__(self, *, lr: float = 0.003, beta1: float = 0.9, beta2: float = 0.99,
                 alpha: float = 0.1, cutoff: float = 10.0) -> None:
        super().__init__(lr=lr)
        for key, value in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= value < 1:
                raise ValueError(f"outer.{key}: must be in [0, 1), got {value!r}")
        if alpha < 0:
            raise ValueError(f"outer.alpha: must be >= 0, got {alpha!r}")
        if cutoff <= 0:
            raise ValueError(f"outer.cutoff: must be > 0 (outer rounds), got {cutoff!r}")
        self.beta1, self.beta2, self.alpha, self.cutoff = beta1, beta2, alpha, cutoff

    def chain_for(self, num_workers: int) -> T.Transform:
        return gated_adam(self.lr, self.beta1, self.beta2, self.alpha, self.cutoff,
                          workers=num_workers)

    def summary(self) -> str:
        return (f"{self.name}: async outer Adam lr {self.lr} betas ({self.beta1}, "
                f"{self.beta2}) over N a step, age weight e^(-{self.alpha} s/N) gated to 0 "
                f"at s/N = {self.cutoff} rounds")
