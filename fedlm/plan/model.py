"""The cost model: one sync round and one async job cycle, and what they predict.

    a job    = download + compute + upload
    download = bytes_down / rate_down + latency     (rate: the worker's link, or its
    upload   = bytes_up   / rate_up   + latency      fair share of the server's link)
    compute  = H × step_time

- **sync** (``sync_round``): every worker starts a round at the same moment,
  so all downloads share the server's link at once; uploads share it as
  workers finish computing; the round ends with the slowest upload. Solved
  exactly by ``fluid_finish_times`` (the simulator's fluid model); with
  jitter, the round is the expected maximum of the jobs (``expected_max``).
- **async** (``async_cycle``): each worker loops job after job, never waiting
  for others; the global model changes on every arrival, so the time per
  outer step is 1 / Σ_w 1/job_time_w. Workers drift apart, so a transfer
  shares the server's link with the *expected* number of other transfers in
  progress — a fixed point. Identical workers with no jitter never drift
  apart (they stay in step, as in the simulator) and are treated as one block.

``predict`` gives both as ``Prediction``s, averaged over the hours of the daily
bandwidth cycle (``fedlm.sim.wire_sizes.daily_factors``) when there is one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedlm.plan.fluid import fluid_finish_times, mean_crowd, water_level
from fedlm.plan.inputs import PlanInput
from fedlm.sim.links import transfer_seconds
from fedlm.sim.wire_sizes import HOUR, daily_factors


# ---------------------------------------------------------------------------
# Jitter: the expected slowest of the jobs
# ---------------------------------------------------------------------------

def _erf(x: np.ndarray) -> np.ndarray:
    """erf, vectorised (Abramowitz & Stegun 7.1.26; error < 1.5e-7)."""
    s = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
               + 0.254829592) * t * np.exp(-x * x)
    return s * y


def expected_max(fixed: np.ndarray, scale: np.ndarray, count: np.ndarray,
                 sigma: float, points: int = 4001) -> float:
    """E[max over workers of fixed_c + scale_c·X], X ~ LogNormal(0, σ) independent,
    ``count[c]`` workers in class c: the expected length of a jittered round.

    E[max] = t0 + ∫_{t0}^{∞} (1 − Π_c F_c(t)^{count_c}) dt, with t0 = max fixed
    (nobody is done earlier), integrated on a grid up to σ·9 above the median.
    """
    if sigma <= 0:
        return float(np.max(fixed + scale))
    t0 = float(np.max(fixed))
    t1 = float(np.max(fixed + scale * math.exp(9 * sigma)))
    t = np.linspace(t0, t1, points)
    log_cdf = np.zeros_like(t)
    for f, c, k in zip(fixed, scale, count):
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.log(np.maximum(t - f, 0.0) / c) / sigma
        cdf = np.where(t > f, 0.5 * (1 + _erf(z / math.sqrt(2))), 0.0)
        log_cdf += k * np.log(np.maximum(cdf, 1e-300))
    return t0 + float(np.trapezoid(1.0 - np.exp(log_cdf), t))


# ---------------------------------------------------------------------------
# One round (sync) and one job cycle (async), at one bandwidth multiplier
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Phases:
    """Seconds per worker of each class in one cycle (sync: the round; async:
    one job): its download, compute and upload (latency and waiting on the
    shared link included) and how long it then sits idle."""

    count: np.ndarray  # workers per class
    download: np.ndarray
    compute: np.ndarray
    upload: np.ndarray
    idle: np.ndarray
    crowd_down: float = 1.0  # transfers a transfer shares the server's link with (itself included)
    crowd_up: float = 1.0

    @property
    def period(self) -> np.ndarray:
        return self.download + self.compute + self.upload + self.idle


def _quantiles(count: np.ndarray, sigma: float, most: int = 32) -> list[np.ndarray]:
    """Per class, m = min(count, most) jitter multipliers standing for its
    workers: the lognormal's quantiles at (j − ½)/m (just 1 without jitter)."""
    from statistics import NormalDist

    if sigma <= 0:
        return [np.ones(1) for _ in count]
    out = []
    for k in count:
        m = int(min(k, most))
        z = np.array([NormalDist().inv_cdf((j + 0.5) / m) for j in range(m)])
        out.append(np.exp(sigma * z))
    return out


def sync_round(inp: PlanInput, factor: float = 1.0) -> Phases:
    """One synchronous round: every worker starts at the barrier.

    The downloads all start at t = 0 and share the server's egress; a worker
    computes once its bytes are in and the latency paid; its upload shares the
    server's ingress with whichever uploads are then in progress; the round
    ends when the last upload (and its latency) has arrived. ``factor`` scales
    every bandwidth (the daily cycle).

    With jitter, the round is the expected maximum of everyone's jittered job
    (``expected_max``). The jitter also spreads the uploads out, so fewer
    overlap: each class's workers upload at the times its compute quantiles
    say (``_quantiles``), and the upload that counts for the round is that of
    its slowest quantile, which shares the link with the fewest.
    """
    c = inp.classes()
    comp, median = c.compute(inp.H, inp.jitter)  # mean and median compute seconds
    jittered = inp.H * c.step_time  # the part of compute the jitter multiplies
    down_end = fluid_finish_times(np.zeros(len(c.count)), np.full(len(c.count), inp.down_bytes()),
                                  c.down_bw * factor, inp.server_down * factor, c.count)
    download = down_end + c.latency
    # one upload flow per (class, quantile), standing for count/m workers
    qs = _quantiles(c.count, inp.jitter)
    cls = np.concatenate([np.full(len(q), i) for i, q in enumerate(qs)])
    start = (download + median - jittered)[cls] + jittered[cls] * np.concatenate(qs)
    weight = (c.count / np.array([len(q) for q in qs]))[cls]
    end = fluid_finish_times(start, np.full(len(cls), inp.up_bytes()), c.up_bw[cls] * factor,
                             inp.server_up * factor, weight)
    took = end - start + c.latency[cls]
    upload = np.array([took[cls == i].mean() for i in range(len(qs))])
    last = np.array([took[cls == i][-1] for i in range(len(qs))])  # the slowest quantile's
    round_time = expected_max(download + last + median - jittered, jittered, c.count,
                              inp.jitter)
    return Phases(c.count, download, comp, upload, round_time - (download + comp + upload),
                  crowd_down=float(np.sum(c.count)) if inp.server_down else 1.0,
                  crowd_up=mean_crowd(start, end, weight) if inp.server_up else 1.0)


def async_cycle(inp: PlanInput, factor: float = 1.0, iterations: int = 500) -> Phases:
    """Each worker's job cycle when nobody waits for anybody (async).

    With no server bottleneck a worker's cycle is just its job:
        J = bytes_down / down_bw + latency + compute + bytes_up / up_bw + latency.
    With one, a transfer shares the server's link with whatever other
    transfers are in progress. Workers of different speeds drift apart, so a
    worker of class v is transferring a fraction p_v = (its transfer seconds)
    / J_v of the time, and a transfer of class c sees, on average:

    - the other classes' k_v workers, each there a fraction p_v of the time;
    - its own class: identical workers with no jitter never drift apart (as
      in the simulator they start together and stay in step), so all k_c
      transfer together; with jitter they drift apart like the others:
      itself plus (k_c − 1)·p_c.

    It gets the max-min fair level of the link among those expected flows
    (``water_level``). As p depends on the rates and the rates on p, iterate
    to the fixed point (damped by half; a few dozen steps).
    """
    c = inp.classes()
    k = c.count
    comp, _ = c.compute(inp.H, inp.jitter)  # mean compute seconds
    links = {"down": (c.down_bw * factor, inp.server_down * factor, inp.down_bytes()),
             "up": (c.up_bw * factor, inp.server_up * factor, inp.up_bytes())}
    rates = {d: cap for d, (cap, _, _) in links.items()}  # each transfer's: full, at first
    crowd = {d: np.ones(len(k)) for d in links}
    contended = inp.server_down > 0 or inp.server_up > 0
    p = {d: np.zeros(len(k)) for d in links}  # share of time a worker is transferring
    for _ in range(iterations if contended else 0):
        new_xfer, new_rates = {}, {}
        for d, (cap, server, nbytes) in links.items():
            # row j: the flows a transfer of class j sees (its own class on the diagonal)
            weights = np.tile(k * p[d], (len(k), 1))
            np.fill_diagonal(weights, k if inp.jitter == 0 else 1 + (k - 1) * p[d])
            new_rates[d] = np.minimum(cap, water_level(weights, cap, server))
            crowd[d] = weights.sum(axis=1)
            new_xfer[d] = nbytes / new_rates[d]
        cycle = new_xfer["down"] + new_xfer["up"] + 2 * c.latency + comp
        new_p = {d: new_xfer[d] / cycle for d in links}
        delta = max(float(np.max(np.abs(new_p[d] - p[d]))) for d in links)
        p = {d: 0.5 * p[d] + 0.5 * new_p[d] for d in links}
        rates = new_rates
        if delta < 1e-9:
            break
    down, up = (transfer_seconds(links[d][2], rates[d], c.latency) for d in ("down", "up"))
    return Phases(k, down, comp, up, np.zeros(len(k)),
                  crowd_down=float(np.average(crowd["down"], weights=k)),
                  crowd_up=float(np.average(crowd["up"], weights=k)))


# ---------------------------------------------------------------------------
# Predictions
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Prediction:
    """One strategy family's outlook: the planner's one result type. Fractions are of
    all workers' time. The exchange's fields say how the outer step's communication
    travels (``fedlm.plan.topology`` fills them for a synchronous outer step over any
    topology, streamed or not; an async prediction keeps the star's defaults)."""

    mode: str  # "sync" | "async"
    time_per_update: float  # seconds between new global models (sync: an outer step)
    time_per_round: float  # sync: an outer step; async: N arrivals (one per worker on average)
    compute_utilisation: float  # share of worker-time spent computing
    comm_fraction: float  # share spent communicating, exposed (latency, link waits included)
    idle_fraction: float  # share spent waiting for others (sync's barrier; async: 0)
    download: float  # mean seconds per job: download (star; 0 for an all-reduce)
    compute: float  # mean seconds per job (sync: per outer step): compute
    upload: float  # mean seconds per job: upload (star; 0 for an all-reduce)
    crowd_down: float  # transfers sharing the server's egress, as a transfer sees it
    crowd_up: float
    # -- the exchange (per outer step unless named per exchange; bytes per node: ``site``)
    topology: str = "star"
    fragments: int = 1  # P (Streaming DiLoCo)
    overlap: int = 0  # τ, inner steps
    exposed: float = 0.0  # communication nobody's compute hides
    hidden: float = 0.0  # communication that overlaps the next segment's compute
    exchange_seconds: float = 0.0  # one fragment's exchange at the given bandwidth
    bytes_per_exchange: float = 0.0  # per node, one fragment's exchange
    bytes_per_site: float = 0.0  # per node, per outer step
    bytes_total: float = 0.0  # all links together (star: what the server moves)
    peak_bandwidth: float = 0.0  # bytes/s: bytes_per_exchange / the time it is given
    site: str = ""  # what bytes_per_site counts

    @property
    def updates_per_hour(self) -> float:
        return HOUR / self.time_per_update


def _summarise(mode: str, phases: list[Phases]) -> Prediction:
    """Combine the phases computed at each hour's bandwidth (one without a daily cycle).

    Over a day, hour h runs 3600 / T_h cycles, so the mean time per cycle is
    24 / Σ_h 1/T_h (slow hours count for more), while the time fractions are
    plain means over the hours (each hour is an hour long). Valid while a
    cycle is short next to an hour.
    """
    k = phases[0].count
    n = float(np.sum(k))

    def rate(ph: Phases) -> float:  # new global models per second in this hour
        if mode == "sync":
            return 1.0 / float(ph.period.max())
        return float(np.sum(k / ph.period))  # every worker's arrival is one

    def frac(ph: Phases, part: np.ndarray) -> float:  # of all workers' time
        return float(np.average(part / ph.period, weights=k))

    def mean(f) -> float:
        return float(np.mean([f(ph) for ph in phases]))

    per_update = len(phases) / sum(rate(ph) for ph in phases)
    comm = mean(lambda ph: frac(ph, ph.download + ph.upload))
    util = mean(lambda ph: frac(ph, ph.compute))
    return Prediction(
        mode=mode, time_per_update=per_update,
        time_per_round=per_update if mode == "sync" else per_update * n,
        compute_utilisation=util, comm_fraction=comm,
        idle_fraction=max(0.0, mean(lambda ph: frac(ph, ph.idle))),
        download=mean(lambda ph: float(np.average(ph.download, weights=k))),
        compute=mean(lambda ph: float(np.average(ph.compute, weights=k))),
        upload=mean(lambda ph: float(np.average(ph.upload, weights=k))),
        crowd_down=mean(lambda ph: ph.crowd_down), crowd_up=mean(lambda ph: ph.crowd_up))


def _factors(inp: PlanInput) -> np.ndarray:
    return daily_factors(inp.daily_amplitude, inp.peak_hour) if inp.daily_amplitude > 0 \
        else np.ones(1)


def predict_sync(inp: PlanInput) -> Prediction:
    """Sync (DiLoCo, FedAvg): one outer step = one round, as long as its slowest job."""
    inp.check()
    return _summarise("sync", [sync_round(inp, f) for f in _factors(inp)])


def predict_async(inp: PlanInput) -> Prediction:
    """Async (async SGD, delayed Nesterov, ...): one outer step = one arrival.

    Throughput = Σ_w 1/J_w new global models per second, J_w the worker's
    cycle (``async_cycle``); nobody waits, so the idle fraction is 0.
    """
    inp.check()
    return _summarise("async", [async_cycle(inp, f) for f in _factors(inp)])


def predict(inp: PlanInput) -> dict[str, Prediction]:
    return {"sync": predict_sync(inp), "async": predict_async(inp)}
