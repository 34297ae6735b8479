"""Crossovers: when is the network fast enough?

The model size at which communication takes a given share of the busy time
(``crossover_params``: 50% is "communication = compute", 10% the largest model
that keeps it small), and the bandwidth a model needs for a share
(``bandwidth_needed``); both by bisection on a log scale over ``predict``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from fedlm.plan.inputs import PlanInput
from fedlm.plan.model import predict_async, predict_sync


def _solve_log(f, lo: float, hi: float, tolerance: float = 1e-4) -> float:
    """x in [lo, hi] where the increasing function f crosses 0 (bisection on log x);
    0 if it is already above 0 at lo, inf if still below at hi."""
    if f(lo) >= 0:
        return 0.0
    if f(hi) <= 0:
        return math.inf
    a, b = math.log(lo), math.log(hi)
    while b - a > tolerance:  # relative precision 1e-4
        m = 0.5 * (a + b)
        if f(math.exp(m)) < 0:
            a = m
        else:
            b = m
    return math.exp(0.5 * (a + b))


def crossover_params(inp: PlanInput, mode: str = "sync", comm_share: float = 0.5,
                     lo: float = 1e3, hi: float = 1e16) -> float:
    """The model size at which communication takes ``comm_share`` of the time
    that communication and compute take together.

    ``comm_share = 0.5``: moving the bytes takes as long as computing the H
    steps — the crossover. Below it the network is fast enough; above it
    workers mostly wait for bytes. ``comm_share = 0.1``: the largest model that
    keeps communication at 10% of the busy time. (The step time is held fixed.)
    """
    predictor = predict_sync if mode == "sync" else predict_async

    def excess(p: float) -> float:
        pr = predictor(replace(inp, params=p))
        return pr.comm_fraction - comm_share * (pr.comm_fraction + pr.compute_utilisation)

    return _solve_log(excess, lo, hi)


def bandwidth_needed(inp: PlanInput, mode: str = "sync", comm_share: float = 0.1,
                     lo: float = 1e3, hi: float = 1e16) -> float:
    """The per-link bandwidth (bytes/s; every link and server link scaled alike,
    so that the slowest link gets this) at which communication is ``comm_share``
    of the busy time for this model."""
    predictor = predict_sync if mode == "sync" else predict_async
    slowest = min(min(inp.down_bw), min(inp.up_bw))

    def scaled(bw: float) -> PlanInput:
        k = bw / slowest
        return replace(inp, down_bw=tuple(b * k for b in inp.down_bw),
                       up_bw=tuple(b * k for b in inp.up_bw),
                       server_down=inp.server_down * k, server_up=inp.server_up * k)

    def deficit(bw: float) -> float:  # decreasing in bw: negate for the solver
        pr = predictor(scaled(bw))
        return comm_share * (pr.comm_fraction + pr.compute_utilisation) - pr.comm_fraction

    return _solve_log(deficit, lo, hi)


def crossovers(inp: PlanInput) -> dict[str, dict[str, float]]:
    """Per mode: the model size where communication = compute, the largest one
    at <= 10% communication, and the bandwidth this model needs for <= 10%."""
    return {mode: {"params_equal": crossover_params(inp, mode, 0.5),
                   "params_10pct": crossover_params(inp, mode, 0.1),
                   "bandwidth_10pct": bandwidth_needed(inp, mode, 0.1)}
            for mode in ("sync", "async")}
