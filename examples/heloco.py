"""HeLoCo as a fedlm plug-in: asynchronous DiLoCo whose stale outer gradients are
corrected by their direction relative to the outer momentum before they are applied.

Source: Al Asif, Diem, Muñoz, Wolf, Jannesari, Mazaheri, "HeLoCo: Efficient
asynchronous low-communication training under data and device heterogeneity", arXiv
2606.00271, 2026. Per tensor b of an arriving outer gradient Δ, with m the outer
(Nesterov) momentum before it:

    c_b    = ⟨Δ_b, m_b⟩ / (‖Δ_b‖ ‖m_b‖)                         alignment
    conf_b = ‖Δ_b‖ / (‖Δ_b‖ + κ‖m_b‖ + ε)                        confidence
    Δ̂_b = Δ_b                                     if c_b ≥ c_ok   (aligned: kept)
          Δ_b − β_b c_b ‖Δ_b‖ m̂_b,  β_b = min(k_s (−c_b) conf_b, β_max)
                                                   if c_b < 0      (conflicting: its
                                                   component against m is shrunk)
          ‖Δ_b‖ ũ_b / max(‖ũ_b‖, ε),  ũ_b = (1 − λ_b) Δ_b/‖Δ_b‖ + λ_b m̂_b
                                                   otherwise       (weakly aligned:
                                                   turned towards m, length kept)
    G = ρ Δ̂;   m ← μ m + (1 − μ) G;   θ ← θ − η (G + μ m)          outer momentum (EMA)

    λ_b = min(k_d (1 − c_b) conf_b, 1)

with m̂_b = m_b / ‖m_b‖. The paper's method section could not be read here (its abstract
could); the rule is a complete secondary statement of it (the "zij" optimizer notes,
junaidaliop.github.io/zij/math/heloco/), which agrees with the abstract: the outer
momentum is the reference, aligned updates are kept, conflicting components corrected.
Its worked example is a test: Δ = (1, 1), m = (1, 0), κ = k_d = 1, c_ok = 0.8 gives c =
0.7071, conf = 0.5858, λ = 0.1716, Δ̂ = (1.1186, 0.8652) (tests/test_heloco.py).

fedlm's choices, none of which could be read from the paper: c_ok 0.2, k_s 1, β_max 1,
k_d 1, κ 1, ε 1e-12; ρ, the paper's worker/delay weight (1 if none), is fedlm's async
scale 1/N (N workers: N arrivals move about as far as one sync round); η = ``outer.lr``
0.7 and μ = ``outer.momentum`` 0.9 (tune η: with the EMA momentum one round of N
arrivals moves the model about η(1 + μ) times their mean, far less than sync DiLoCo's
Nesterov at the same η). While m_b is zero (the first arrival) nothing is corrected.
(This file once took λ_b = min(k_d (c_ok − c_b) conf_b, 1), the summary then being cut
short there, and the heavy-ball momentum m ← μm + G: at 0.7 that is fedlm's
per-arrival Nesterov, which its own results found unstable.)

Simplified: a block is a whole tensor; no extra staleness weight beyond the correction.

    PYTHONPATH=examples fedlm run --set strategy=heloco:HeLoCo --set model=tiny \\
        --set profile=very
"""

from __future__ import annotations

import torch

from fedlm.strategies import transforms as T
from fedlm.strategies.async_base import AsyncStrategy

EPS = 1e-12
SOURCE = ("reconstruction of Al Asif et al. 2026 (arXiv 2606.00271) from its abstract and "
          "a complete secondary statement (zij): its correction and EMA momentum, a "
          "worked example pinned; every constant, rho = 1/N and eta fedlm's")


def corrected(d: torch.Tensor, m: torch.Tensor, *, c_ok: float, k_s: float, beta_max: float,
              k_d: float, kappa: float) -> torch.Tensor:
    """Δ̂_b: one tensor of an outer gradient corrected against the momentum ``m``."""
    nd, nm = float(d.norm()), float(m.norm())
    if nd <= EPS or nm <= EPS:
        return d  # no reference direction yet (or nothing to correct)
    v = m / nm
    c = float((d * v).sum()) / nd
    if c >= c_ok:
        return d
    conf = nd / (nd + kappa * nm + EPS)
    if c < 0:
        beta = min(k_s * -c * conf, beta_max)
        return d - (beta * c * nd) * v
    lam = min(k_d * (1.0 - c) * conf, 1.0)
    turned = (1.0 - lam) * (d / nd) + lam * v
    return turned * (nd / max(float(turned.norm()), EPS))


def direction_corrected_nesterov(lr: float, momentum: float, rho: float,
                                 settings: dict) -> T.Transform:
    """HeLoCo's outer step as a transform: correct each tensor, then the EMA-momentum
    look-ahead step on ρ·Δ̂."""

    def init(params):
        return {"m": T.tree_map(lambda p: p.new_zeros(p.shape), params), "corrected": 0}

    def update(grads, state, info):
        fixed = T.tree_map(lambda d, m: corrected(d, m, **settings), grads, state["m"])
        changed = sum(fixed[k] is not grads[k] for k in grads)
        g = T.tree_map(lambda d: d * rho, fixed)
        m = T.tree_map(lambda m, g: momentum * m + (1.0 - momentum) * g, state["m"], g)
        step = T.tree_map(lambda m, g: lr * (g + momentum * m), m, g)
        return step, {"m": m, "corrected": state["corrected"] + changed}

    return T.Transform(init, update)


class HeLoCo(AsyncStrategy):
    """Async DiLoCo with HeLoCo's direction-aware correction of stale outer gradients."""

    name = "heloco"
    source = SOURCE

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, c_ok: float = 0.2,
                 k_s: float = 1.0, beta_max: float = 1.0, k_d: float = 1.0,
                 kappa: float = 1.0) -> None:
        super().__init__(lr=lr, momentum=momentum, nesterov=True)
        if not -1.0 <= c_ok <= 1.0:
            raise ValueError(f"outer.c_ok: must be in [-1, 1], got {c_ok!r}")
        for key, value in (("k_s", k_s), ("beta_max", beta_max), ("k_d", k_d),
                           ("kappa", kappa)):
            if value < 0:
                raise ValueError(f"outer.{key}: must be >= 0, got {value!r}")
        self.settings = dict(c_ok=c_ok, k_s=k_s, beta_max=beta_max, k_d=k_d, kappa=kappa)

    def chain_for(self, num_workers: int) -> T.Transform:
        return direction_corrected_nesterov(self.lr, self.momentum, 1.0 / num_workers,
                                            self.settings)

    def summary(self) -> str:
        knobs = ", ".join(f"{k} {v}" for k, v in self.settings.items())
        return (f"{self.name}: async, direction-corrected outer Nesterov lr {self.lr} "
                f"momentum {self.momentum}, {knobs}")
