"""An outer step over a collective topology, whole or streamed in fragments.

The exchange of outer gradients (``fedlm.sim.collectives``, the formulas the
simulator uses too):

- ``star`` / ``hierarchical``: every node uploads to a parameter server and
  downloads the new model; timed by ``fedlm.plan.model.sync_round`` (the
  server link's contention, jitter, the daily cycle), as before;
- ``ring`` / ``tree``: an all-reduce among the nodes, no server:
  ``allreduce_seconds(encoded bytes, n, slowest link, largest latency)``. It
  needs every node, so these are synchronous only: no async prediction.

Streaming DiLoCo (``fragments`` P, ``overlap`` τ): the model is split into P
fragments of params/P values; an outer step of H inner steps becomes P
segments of H/P steps. At the end of each segment one fragment is exchanged,
and that exchange may run during the first τ inner steps of the next segment:

    segment  = (H/P) · step + exposed          exposed = max(0, C_frag − τ · step)
    hidden   = min(C_frag, τ · step)           C_frag: one fragment's exchange

``step`` is the slowest node's (the barrier waits for it). An outer step is P
segments. P = 1, τ = 0 is plain DiLoCo: for a star, exactly ``predict_sync``.

**Peak bandwidth** (``peak_bandwidth``): what one exchange asks of a node's
link, bytes per node of one exchange over the time it is given: with overlap,
τ · step (the exchange must end by then to stay hidden); without, the time it
does take at the given bandwidth (so it is the link's own rate: a blocking
exchange takes whatever the link gives). Streaming cuts the bytes of one
exchange P-fold, and with τ > 0 spreads them over τ steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fedlm.plan.crossovers import _solve_log, bandwidth_needed, crossover_params
from fedlm.plan.inputs import PlanInput
from fedlm.plan.model import (Prediction, _factors, expected_max, predict_async,
                              predict_sync, sync_round)
from fedlm.sim.collectives import (ALLREDUCE, allreduce_seconds, ring_bytes_per_site,
                                   tree_bytes_per_site)
from fedlm.sim.links import hidden_seconds


def is_plain(inp: PlanInput) -> bool:
    """Today's model exactly: a star (or pods) without streaming."""
    return inp.topology not in ALLREDUCE and inp.fragments == 1 and inp.overlap == 0


def has_async(inp: PlanInput) -> bool:
    """Only a plain star has an async variant: an all-reduce needs every node, and
    streaming is defined for a synchronous outer step."""
    return is_plain(inp)


def segment_input(inp: PlanInput) -> PlanInput:
    """One segment as a plan of its own: a fragment of params/P values, H/P steps."""
    return replace(inp, params=inp.params / inp.fragments, H=inp.H // inp.fragments,
                   fragments=1, overlap=0)


# ---------------------------------------------------------------------------
# Bytes
# ---------------------------------------------------------------------------

def exchange_bytes(inp: PlanInput) -> tuple[float, float, float, str]:
    """(bytes per node of one fragment's exchange, per node per outer step, all
    links per outer step, what "per node" means)."""
    seg = segment_input(inp)
    n = inp.nodes
    if inp.topology in ("star", "hierarchical"):
        one = seg.up_bytes() + seg.down_bytes()  # what crosses a node's link, up + down
        per_site, total = inp.fragments * one, inp.fragments * one * n
        site = ("a pod (data centre), up + down; the server moves n x that"
                if inp.hierarchical else "a node, up + down; the server moves n x that")
    elif inp.topology == "ring":
        one = ring_bytes_per_site(seg.up_bytes(), n)
        per_site, total = inp.fragments * one, inp.fragments * one * n
        site = "every node, sent (as much is received)"
    else:  # tree
        one = tree_bytes_per_site(seg.up_bytes(), n)
        per_site = inp.fragments * one
        # each of the n − 1 edges carries the payload once up and once down
        total = inp.fragments * 2 * max(0, n - 1) * seg.up_bytes()
        site = "the busiest node (an inner node of the tree), sent"
    return one, per_site, total, site


# ---------------------------------------------------------------------------
# Time
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Segment:
    """One segment: seconds, a node's mean compute, exposed and hidden
    communication, the shares of time, one exchange's seconds, the slowest step;
    a star's also its sync round as ``predict_sync`` gives it (per-job transfers)."""

    seconds: float
    compute: float
    exposed: float
    hidden: float
    util: float
    comm: float
    idle: float
    exchange: float
    step: float
    round: Prediction | None = None


def _star(inp: PlanInput) -> _Segment:
    """A star segment: the sync round of one fragment over H/P steps. With overlap,
    each node's exchange (its fragment's upload and the new one's download) runs
    behind its own first τ steps, so a node of class c takes its compute plus
    max(0, exchange_c − τ·step_c), and the segment is the expected slowest of
    those (as the simulator times each job: ``JobTimer.overlapped_timing``)."""
    seg = segment_input(inp)
    pred = predict_sync(seg)
    c = seg.classes()
    step = float(np.max(c.compute(seg.H, seg.jitter)[0])) / seg.H  # the slowest node's
    exchange = pred.download + pred.upload
    if inp.overlap == 0:  # today's round, exactly
        return _Segment(pred.time_per_update, pred.compute, exchange, 0.0,
                        pred.compute_utilisation, pred.comm_fraction, pred.idle_fraction,
                        exchange, step, pred)
    mean, _ = c.compute(seg.H, seg.jitter)
    rates, util, comm, idle, exposed_h, hidden_h, exch_h = [], [], [], [], [], [], []
    for f in _factors(inp):
        ph = sync_round(seg, f)
        per_class = ph.download + ph.upload  # each class's exchange at this hour
        ahead = inp.overlap * c.step_time  # τ steps of each class's (median) compute
        exposed = np.maximum(0.0, per_class - ahead)
        span = expected_max(exposed + seg.H * c.allreduce, seg.H * c.step_time, c.count,
                            seg.jitter)
        k = c.count
        rates.append(1 / span)
        util.append(float(np.average(mean, weights=k)) / span)
        comm.append(float(np.average(exposed, weights=k)) / span)
        idle.append(max(0.0, 1 - util[-1] - comm[-1]))
        exposed_h.append(float(np.average(exposed, weights=k)))
        hidden_h.append(float(np.average(hidden_seconds(per_class, ahead), weights=k)))
        exch_h.append(float(np.average(per_class, weights=k)))
    return _Segment(len(rates) / sum(rates), float(np.average(mean, weights=c.count)),
                    float(np.mean(exposed_h)), float(np.mean(hidden_h)), float(np.mean(util)),
                    float(np.mean(comm)), float(np.mean(idle)), float(np.mean(exch_h)), step,
                    pred)


def _allreduce(inp: PlanInput) -> _Segment:
    """The same for a ring or tree segment: the nodes compute H/P steps (the
    slowest sets the barrier), then all-reduce a fragment over the slowest link
    with the largest latency, hidden behind up to τ steps of the next segment.
    Averaged over the daily cycle's hours as ``fedlm.plan.model`` does."""
    seg = segment_input(inp)
    c = seg.classes()
    k = c.count
    mean, _ = c.compute(seg.H, seg.jitter)
    step = expected_max(seg.H * c.allreduce, seg.H * c.step_time, k, seg.jitter) / seg.H
    nbytes = seg.up_bytes()
    bw = min(min(inp.down_bw), min(inp.up_bw))
    lat = max(inp.latency)
    rates, util, comm, idle, exch, exposed_h, hidden_h = [], [], [], [], [], [], []
    for f in _factors(inp):
        cost = allreduce_seconds(inp.topology, nbytes, inp.nodes, bw * f, lat)
        # each node hides what its own first τ steps cover (the simulator's rule)
        hidden = hidden_seconds(cost, inp.overlap * c.step_time)
        t = expected_max(cost - hidden + seg.H * c.allreduce, seg.H * c.step_time, k,
                         seg.jitter)
        u = float(np.average(mean, weights=k)) / t
        exposed = float(np.average(cost - hidden, weights=k))
        rates.append(1 / t)
        util.append(u)
        comm.append(exposed / t)
        idle.append(max(0.0, 1 - u - exposed / t))
        exch.append(cost)
        exposed_h.append(exposed)
        hidden_h.append(float(np.average(hidden, weights=k)))
    return _Segment(len(rates) / sum(rates), float(np.average(mean, weights=c.count)),
                    float(np.mean(exposed_h)), float(np.mean(hidden_h)), float(np.mean(util)),
                    float(np.mean(comm)), float(np.mean(idle)), float(np.mean(exch)), step)


def plan_topology(inp: PlanInput) -> Prediction:
    """The synchronous outer step over ``inp.topology``, streamed as asked: a plain
    star is ``predict_sync`` exactly, with its exchange's bytes."""
    inp.check()
    one, per_site, total, site = exchange_bytes(inp)
    if is_plain(inp):
        pred = predict_sync(inp)
        exchange = pred.download + pred.upload
        return replace(pred, exposed=exchange, exchange_seconds=exchange,
                       bytes_per_exchange=one, bytes_per_site=per_site, bytes_total=total,
                       peak_bandwidth=one / exchange if exchange > 0 else 0.0, site=site)
    s = _allreduce(inp) if inp.topology in ALLREDUCE else _star(inp)
    window = inp.overlap * s.step if inp.overlap else s.exchange
    p = inp.fragments
    seg = s.round  # a star's: its per-job transfers; an all-reduce has none
    return Prediction(
        mode="sync", time_per_update=p * s.seconds, time_per_round=p * s.seconds,
        compute_utilisation=s.util, comm_fraction=s.comm, idle_fraction=s.idle,
        download=seg.download if seg else 0.0, compute=p * s.compute,
        upload=seg.upload if seg else 0.0, crowd_down=seg.crowd_down if seg else 1.0,
        crowd_up=seg.crowd_up if seg else 1.0,
        topology=inp.topology, fragments=p, overlap=inp.overlap, exposed=p * s.exposed,
        hidden=p * s.hidden, exchange_seconds=s.exchange, bytes_per_exchange=one,
        bytes_per_site=per_site, bytes_total=total,
        peak_bandwidth=one / window if window > 0 else 0.0, site=site)


def predict_topology(inp: PlanInput) -> dict[str, Prediction | None]:
    """{"sync": ``plan_topology``, "async": ``predict_async`` or None (a plain star
    alone has an async variant)}."""
    return {"sync": plan_topology(inp), "async": predict_async(inp) if has_async(inp) else None}


# ---------------------------------------------------------------------------
# When is the network fast enough?
# ---------------------------------------------------------------------------

def _excess(tp: Prediction, share: float) -> float:
    return tp.comm_fraction - share * (tp.comm_fraction + tp.compute_utilisation)


def scaled_bandwidth(inp: PlanInput, bw: float) -> PlanInput:
    """``inp`` with every link (and the server's) scaled so the slowest gets ``bw``."""
    k = bw / min(min(inp.down_bw), min(inp.up_bw))
    return replace(inp, down_bw=tuple(b * k for b in inp.down_bw),
                   up_bw=tuple(b * k for b in inp.up_bw),
                   server_down=inp.server_down * k, server_up=inp.server_up * k)


def topology_bandwidth(inp: PlanInput, share: float = 0.1) -> float:
    """Bytes/s on the slowest link for communication to be ``share`` of the busy
    time (compute + exposed communication): ``bandwidth_needed`` for a plain star."""
    if is_plain(inp):
        return bandwidth_needed(inp, "sync", share)
    return _solve_log(lambda bw: -_excess(plan_topology(scaled_bandwidth(inp, bw)), share),
                      1e3, 1e16)


def topology_params(inp: PlanInput, share: float) -> float:
    """The model size at which communication is ``share`` of the busy time
    (``crossover_params`` for a plain star; the step time held fixed)."""
    if is_plain(inp):
        return crossover_params(inp, "sync", share)
    return _solve_log(lambda p: _excess(plan_topology(replace(inp, params=p)), share),
                      1e3, 1e16)


def topology_crossovers(inp: PlanInput) -> dict:
    """As ``fedlm.plan.crossovers.crossovers``; None for the async column where
    there is no async variant."""
    sync = {"params_equal": topology_params(inp, 0.5),
            "params_10pct": topology_params(inp, 0.1),
            "bandwidth_10pct": topology_bandwidth(inp, 0.1)}
    if not has_async(inp):
        return {"sync": sync, "async": None}
    return {"sync": sync, "async": {"params_equal": crossover_params(inp, "async", 0.5),
                                    "params_10pct": crossover_params(inp, "async", 0.1),
                                    "bandwidth_10pct": bandwidth_needed(inp, "async", 0.1)}}
