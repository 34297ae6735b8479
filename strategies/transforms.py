"""Composable outer-optimizer pieces, optax style.

A ``Transform`` is a pair of pure functions:

    init(params)                  -> state
    update(grads, state, info)    -> (step, new_state)

``info`` is the ``Update`` being applied (its staleness, worker, tokens, ...),
or None for a synchronous round's aggregate. ``step`` None means "nothing to
apply now": the transform holds the gradient (a buffer not yet full) or drops
it (too stale). ``chain`` composes transforms left to right and stops at the
first None; the strategy then descends: θ ← θ − step. Tensors are dicts
name -> tensor (see fedlm.params); states are small dicts of such dicts, so
they save with ``torch.save``. Tensors are only touched through their own
methods, so this module (and the strategies built on it) imports without torch.

    FedAvg / Local-SGD  = chain(scale(1.0))
    DiLoCo              = chain(trace(0.9, nesterov=True), scale(0.7))
    Poly (async)        = chain(weight_by_staleness(w, divide_by=N), sgd(0.7, 0.9, True))
    FedBuff (async)     = chain(weight_by_staleness(w), buffer(K), sgd(0.7, 0.9, True))
    FedAdam (sync)      = chain(adaptive("adam", 0.9, 0.99, 1e-3), scale(0.1))
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple

if TYPE_CHECKING:
    import torch

Tensors = "OrderedDict[str, torch.Tensor]"


class Transform(NamedTuple):
    init: Callable[[Any], Any]
    update: Callable[[Any, Any, Any], tuple[Any, Any]]


def tree_map(fn, *trees) -> "OrderedDict[str, torch.Tensor]":
    """``fn`` applied name by name across tensor dicts, in the first one's order."""
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


def normalized_mean(grads: list, steps: list[int]) -> "OrderedDict[str, torch.Tensor]":
    """FedNova's merge of updates that took different numbers of local steps:
    τ_eff · (1/m) Σ g_i / a_i with τ_eff = (1/m) Σ a_i (``a_i`` = ``steps[i]``; equal data
    weights 1/m). Each update counts as its *per-step* direction, rescaled to the mean
    number of steps, so a worker that ran 10x the steps does not pull 10x as hard (as
    with token weights) nor is its extra progress thrown away (as with a uniform mean
    of whole updates). Equal steps: the uniform mean. Wang et al., "Tackling the
    Objective Inconsistency Problem in Heterogeneous Federated Optimization",
    NeurIPS 2020, https://arxiv.org/abs/2007.07481"""
    m = len(grads)
    tau_eff = sum(steps) / m
    out = OrderedDict()
    for k in grads[0]:
        acc = _zeros(grads[0][k])
        for g, a in zip(grads, steps):
            acc.add_(g[k], alpha=tau_eff / (m * a))
        out[k] = acc
    return out


def scale(factor: float) -> Transform:
    """step = factor · g (the outer learning rate)."""

    def init(params):
        return {}

    def update(grads, state, info):
        return tree_map(lambda g: g * factor, grads), state

    return Transform(init, update)


def weight_by_staleness(weight_fn: Callable[[int], float | None],
                        divide_by: int = 1) -> Transform:
    """g · (w(s) / divide_by), s = ``info.staleness``; w(s) None drops the update.

    One multiply per tensor, ``g * (w / divide_by)``. Async strategies pass
    divide_by = N (workers) so that N arrivals move about as far as one sync
    round. The state counts the dropped updates.
    """

    def init(params):
        return {"dropped": 0}

    def update(grads, state, info):
        w = weight_fn(info.staleness)
        if w is None:
            return None, {"dropped": state["dropped"] + 1}
        factor = w / divide_by
        return tree_map(lambda g: g * factor, grads), state

    return Transform(init, update)


def buffer(k: int) -> Transform:
    """Hold gradients until ``k`` have arrived, then emit their plain mean (FIFO order)."""

    def init(params):
        return {"buffer": []}

    def update(grads, state, info):
        buf = [*state["buffer"], grads]
        if len(buf) < k:
            return None, {"buffer": buf}
        return weighted_mean(buf, [1.0] * len(buf)), {"buffer": []}

    return Transform(init, update)


def trace(momentum: float, nesterov: bool = False) -> Transform:
    """Heavy-ball or Nesterov momentum, in the form the async-local-SGD paper writes:

        m ← β·m + g;   step = β·m + g  (Nesterov)   or   step = m  (heavy ball)
    """

    def init(params):
        return {"m": tree_map(_zeros, params)}

    def update(grads, state, info):
        m = tree_map(lambda m, g: momentum * m + g, state["m"], grads)
        step = tree_map(lambda m, g: momentum * m + g, m, grads) if nesterov else m
        return step, {"m": m}

    return Transform(init, update)


def adaptive(second: str, beta1: float = 0.9, beta2: float = 0.99,
             tau: float = 1e-3) -> Transform:
    """The adaptive outer optimizers of Reddi et al. 2021 ("Adaptive Federated
    Optimization", Algorithm 2; Flower's FedAdam, FedYogi, FedAdagrad), as a direction
    (chain ``scale(lr)`` after it):

        m ← β₁·m + (1 − β₁)·g
        v ← β₂·v + (1 − β₂)·g²                    second = "adam"
        v ← v − (1 − β₂)·g²·sign(v − g²)         second = "yogi"
        v ← v + g²                                second = "adagrad"
        step = m / (√v + τ)

    v starts at τ² (the paper's v₋₁ ≥ τ²), m at 0; no bias correction (the paper has
    none; Flower's FedAdam rescales its lr by one)."""
    if second not in ("adam", "yogi", "adagrad"):
        raise ValueError(f"adaptive: adam, yogi or adagrad, got {second!r}")

    def init(params):
        return {"m": tree_map(_zeros, params),
                "v": tree_map(lambda p: _zeros(p) + tau * tau, params)}

    def update(grads, state, info):
        m = tree_map(lambda m, g: beta1 * m + (1 - beta1) * g, state["m"], grads)
        if second == "adam":
            v = tree_map(lambda v, g: beta2 * v + (1 - beta2) * g * g, state["v"], grads)
        elif second == "yogi":
            v = tree_map(lambda v, g: v - (1 - beta2) * g * g * (v - g * g).sign(),
                         state["v"], grads)
        else:
            v = tree_map(lambda v, g: v + g * g, state["v"], grads)
        return tree_map(lambda m, v: m / (v.sqrt() + tau), m, v), {"m": m, "v": v}

    return Transform(init, update)


def chain(*transforms: Transform) -> Transform:
    """Apply ``transforms`` left to right; the state is a tuple of their states.

    A transform that returns step None stops the chain: the result is
    (None, state) with the states of the transforms that ran updated and the
    rest as they were.
    """

    def init(params):
        return tuple(t.init(params) for t in transforms)

    def update(grads, state, info):
        new_state = list(state)
        for i, t in enumerate(transforms):
            grads, new_state[i] = t.update(grads, state[i], info)
            if grads is None:
                break
        return grads, tuple(new_state)

    return Transform(init, update)


def sgd(lr: float, momentum: float = 0.0, nesterov: bool = False) -> Transform:
    """Outer SGD; with momentum > 0 a (Nesterov) momentum trace comes first."""
    if momentum == 0.0:
        return chain(scale(lr))
    return chain(trace(momentum, nesterov), scale(lr))


def descend(params, step) -> "OrderedDict[str, torch.Tensor]":
    """θ ← θ − step (the outer gradient points uphill, see fedlm.params)."""
    return tree_map(lambda p, s: p - s, params, step)


def find(state, key: str) -> Iterator[Any]:
    """Every value stored under ``key`` in a (chained) state, left to right:
    ``sum(find(state, "dropped"))`` counts the updates a chain dropped."""
    if isinstance(state, dict):
        if key in state:
            yield state[key]
    elif isinstance(state, tuple):
        for s in state:
            yield from find(s, key)


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
        return {"m": tree_map(_zeros, params), "delta": tree_map(_zeros, params),
                "t": 0}

    def update(grads, state, info):
        delta = tree_map(lambda d, g: d + g, state["delta"], grads)
        m = state["m"]
        if (state["t"] + 1) % n == 0:
            m = tree_map(lambda m, d: momentum * m + d / n, m, delta)
            k = (1.0 - c * n + c) * momentum
            step = tree_map(lambda m, g: k * m + g / n, m, grads)
            delta = tree_map(_zeros, delta)
        else:
            step = tree_map(lambda m, g: c * momentum * m + g / n, m, grads)
        return step, {"m": m, "delta": delta, "t": state["t"] + 1}

    return Transform(init, update)

