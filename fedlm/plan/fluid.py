"""Sharing a link: the simulator's max-min fair fluid model, solved on paper.

``water_level`` is the fair share of a link among flows with caps (each flow
possibly counted a fraction of a time: the async model's expected crowd);
``fluid_finish_times`` plays a set of transfers through one link event by
event, as ``fedlm.sim.network`` does; ``mean_crowd`` says how many transfers a
transfer shares the link with on average.
"""

from __future__ import annotations

import math

import numpy as np


def water_level(weights: np.ndarray, caps: np.ndarray, capacity: float) -> np.ndarray | float:
    """Max-min fair share of ``capacity`` among flows of the given caps.

    Flow i counts ``weights[i]`` times (k identical flows; or a fraction, "this
    flow is there that fraction of the time", in the async model). The level λ
    solves Σ_i w_i·min(c_i, λ) = capacity: flows capped below λ get their cap,
    every other flow gets λ. ``inf`` if the link is unlimited (capacity 0) or
    is no bottleneck. ``weights`` may be 2-D: one level per row (same caps).

    Water-filling: with caps sorted, fill the smallest flows to their caps
    while what is left, split among the rest, exceeds the next cap.
    """
    w = np.atleast_2d(np.asarray(weights, float))
    if capacity <= 0:
        out = np.full(len(w), math.inf)
    else:
        order = np.argsort(caps)
        c, w = np.asarray(caps, float)[order], w[:, order]
        # before flow i: bytes/s taken by the smaller flows, and the weight still to serve
        taken = np.cumsum(w * c, axis=1) - w * c
        rest = w.sum(axis=1, keepdims=True) - (np.cumsum(w, axis=1) - w)
        held = (c * rest > capacity - taken) & (w > 0)  # flow i is held below its cap
        first = np.argmax(held, axis=1)
        rows = np.arange(len(w))
        out = np.where(held.any(axis=1),
                       (capacity - taken[rows, first]) / np.maximum(rest[rows, first], 1e-300),
                       math.inf)
    return float(out[0]) if np.ndim(weights) == 1 else out


def fluid_finish_times(start: np.ndarray, size: np.ndarray, cap: np.ndarray,
                       capacity: float, weight: np.ndarray | None = None) -> np.ndarray:
    """When each of a set of transfers ends, sharing one link (processor sharing).

    Transfer i starts at ``start[i]`` with ``size[i]`` bytes and moves at most
    at ``cap[i]`` bytes/s (``weight[i]`` identical copies of it); while several
    are in progress they split the link's ``capacity`` max-min fairly, and the
    rates change whenever one starts or ends. With capacity 0 (unlimited)
    every transfer runs at its cap. This is the simulator's fluid model
    (``fedlm.sim.network``), solved event by event.
    """
    start, size, cap = (np.asarray(x, float) for x in (start, size, cap))
    weight = np.ones(len(start)) if weight is None else np.asarray(weight, float)
    if capacity <= 0:
        return start + size / cap
    left = size.copy()
    end = np.full(len(start), np.nan)
    t = float(start.min())
    while np.isnan(end).any():
        pending = np.isnan(end)
        active = (start <= t) & pending
        if not active.any():  # nothing in progress: jump to the next start
            t = float(start[pending].min())
            continue
        rate = np.minimum(cap[active], water_level(weight[active], cap[active], capacity))
        finish = t + left[active] / rate
        later = start[(start > t) & pending]  # the next change: an end, or a start
        t_next = min(float(finish.min()), float(later.min()) if len(later) else math.inf)
        left[active] -= rate * (t_next - t)
        idx = np.flatnonzero(active)
        end[idx[(finish <= t_next * (1 + 1e-12)) | (left[idx] <= 1e-9 * size[idx])]] = t_next
        t = t_next
    return end


def mean_crowd(start: np.ndarray, end: np.ndarray, weight: np.ndarray) -> float:
    """How many transfers a transfer shares the link with on average (itself
    included): ∫ n(t)² dt / ∫ n(t) dt, n(t) the transfers in progress at t."""
    times = np.concatenate([start, end])
    steps = np.concatenate([weight, -weight])
    order = np.lexsort((steps, times))  # at a tie, an end before a start
    times, n = times[order], np.cumsum(steps[order])
    dt = np.diff(times)
    busy = float(np.sum(n[:-1] * dt))
    return float(np.sum(n[:-1] ** 2 * dt)) / busy if busy > 0 else 1.0
