"""Composable outer-optimizer pieces, optax style.

A ``Transform`` is a pair of pure functions:

    init(params)            -> state
    update(grads, state)    -> (step, new_state)

``chain`` composes them left to right; the strategy then descends:
θ ← θ − step. Tensors are dicts name -> tensor (see fedlm.params); states are
small dicts of such dicts, so they save with ``torch.save``. Tensors are only
touched through their own methods, so this module (and the strategies built on it)
imports without torch.

    FedAvg / Local-SGD  = chain(scale(1.0))
    DiLoCo              = chain(trace(0.9, nesterov=True), scale(0.7))
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

if TYPE_CHECKING:
    import torch

Tensors = "OrderedDict[str, torch.Tensor]"


class Transform(NamedTuple):
    init: Callable[[Any], Any]
    update: Callable[[Any, Any], tuple[Any, Any]]


def _map(fn, *trees):
    return OrderedDict((k, fn(*(t[k] for t in trees))) for k in trees[0])


def _zeros(t: "torch.Tensor") -> "torch.Tensor":
    """Zeros of ``t``'s shape, dtype and device (``torch.zeros_like`` without torch)."""
    return t.new_zeros(t.shape)


def weighted_mean(grads: list, weights: list[float]) -> "OrderedDict[str, torch.Tensor]":
    """Σ w_i g_i / Σ w_i, summed in the given order (callers fix the order)."""
    total = float(sum(weights))
    out = OrderedDict()
    for k in grads[0]:
        acc = _zeros(grads[0][k])
        for g, w in zip(grads, weights):
            acc.add_(g[k], alpha=w / total)
        out[k] = acc
    return out


def scale(factor: float) -> Transform:
    """step = factor · g (the outer learning rate)."""

    def init(params):
        return {}

    def update(grads, state):
        return _map(lambda g: g * factor, grads), state

    return Transform(init, update)


def trace(momentum: float, nesterov: bool = False) -> Transform:
    """Heavy-ball or Nesterov momentum, in the form the async-local-SGD paper writes:

        m ← β·m + g;   step = β·m + g  (Nesterov)   or   step = m  (heavy ball)
    """

    def init(params):
        return {"m": _map(_zeros, params)}

    def update(grads, state):
        m = _map(lambda m, g: momentum * m + g, state["m"], grads)
        step = _map(lambda m, g: momentum * m + g, m, grads) if nesterov else m
        return step, {"m": m}

    return Transform(init, update)


def chain(*transforms: Transform) -> Transform:
    """Apply ``transforms`` left to right; the state is a tuple of their states."""

    def init(params):
        return tuple(t.init(params) for t in transforms)

    def update(grads, state):
        new_state = []
        for t, s in zip(transforms, state):
            grads, s = t.update(grads, s)
            new_state.append(s)
        return grads, tuple(new_state)

    return Transform(init, update)


def sgd(lr: float, momentum: float = 0.0, nesterov: bool = False) -> Transform:
    """Outer SGD; with momentum > 0 a (Nesterov) momentum trace comes first."""
    if momentum == 0.0:
        return chain(scale(lr))
    return chain(trace(momentum, nesterov), scale(lr))


def descend(params, step) -> "OrderedDict[str, torch.Tensor]":
    """θ ← θ − step (the outer gradient points uphill, see fedlm.params)."""
    return _map(lambda p, s: p - s, params, step)


def delayed_nesterov(momentum: float, buffer_size: int, c: float = 0.0) -> Transform:
    """Delayed Nesterov (Liu et al. 2024, Algorithm 3), without the learning rate.

    Each arriving outer gradient g is applied at once as g/N; the momentum is
    updated only every N-th arrival, from the sum Δ of the N gradients since:

        Δ ← Δ + g
        every N-th:  m ← β·m + Δ/N;  step = (1 − c·N + c)·β·m + g/N;  Δ ← 0
        otherwise:   step = c·β·m + g/N

    With c = 0, N consecutive steps add up to one Nesterov step on the mean of
    the N gradients; with N = 1 it is Nesterov.
    """
    if buffer_size < 1:
        raise ValueError(f"outer.buffer_size: must be >= 1, got {buffer_size!r}")
    if not 0.0 <= c <= 1.0 / buffer_size:
        raise ValueError(f"outer.c: must be in [0, 1/buffer_size], got {c!r}")
    n = buffer_size

    def init(params):
        return {"m": _map(_zeros, params), "delta": _map(_zeros, params),
                "t": 0}

    def update(grads, state):
        delta = _map(lambda d, g: d + g, state["delta"], grads)
        m = state["m"]
        if (state["t"] + 1) % n == 0:
            m = _map(lambda m, d: momentum * m + d / n, m, delta)
            k = (1.0 - c * n + c) * momentum
            step = _map(lambda m, g: k * m + g / n, m, grads)
            delta = _map(_zeros, delta)
        else:
            step = _map(lambda m, g: c * momentum * m + g / n, m, grads)
        return step, {"m": m, "delta": delta, "t": state["t"] + 1}

    return Transform(init, update)
