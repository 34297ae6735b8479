"""Cost model: how long an outer step takes, and how much of it is network.

``fedlm plan`` answers, without running anything: given a model of P
parameters, D data centres (each a worker, or several), their step times, H
local steps per job, their links to the server (latency, bandwidth), the
server's own shared link and how uploads are compressed — how long is one
outer step, what fraction of the workers' time goes to moving bytes, to
computing, and to waiting, for a synchronous strategy (DiLoCo, FedAvg: a
barrier every round) and an asynchronous one (async SGD, delayed Nesterov:
every update applied on arrival)?

It is the simulator's timing model (``fedlm.fleet``, ``fedlm.network``,
``fedlm.engine``) solved on paper:

    a job   = download + compute + upload
    download = bytes_down / rate_down + latency     (rate: the worker's link, or its
    upload   = bytes_up   / rate_up   + latency      fair share of the server's link)
    compute  = H × step_time

- **sync**: every worker starts a round at the same moment, so all downloads
  share the server's link at once; uploads share it as workers finish
  computing; the round ends with the slowest upload. Solved exactly by
  ``fluid_finish_times`` (the same max-min fair fluid model as the simulator).
- **async**: each worker loops job after job, never waiting for others; the
  global model changes on every arrival, so the time per outer step is
  1 / Σ_w 1/job_time_w. Workers drift apart, so a transfer shares the server's
  link with the *expected* number of other transfers in progress — a fixed
  point (``async_cycle``). Identical workers with no jitter never drift apart
  (they stay in step, as in the simulator) and are treated as one block.

Everything is plain numpy and arithmetic: no torch, no simulation.
Bandwidths are bytes per second, like ``fedlm.fleet`` (the CLI takes bits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fedlm.config import ConfigError

# Bytes per value of an upload, by encoding (``network.compression``). int8 and
# int4 also send one fp32 scale per block of ``block_size`` values.
BYTES_PER_VALUE = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "int4": 0.5}
SCALE_BYTES = 4.0
HOUR = 3600.0


def payload_bytes(params: float, compression: str = "fp32", block_size: int = 256,
                  tensors: int = 1) -> float:
    """Bytes on the wire for ``params`` values sent as ``compression``.

    fp32/bf16/fp16: 4/2/2 bytes a value. int8/int4: 1 or ½ byte a value (int4
    packs two a byte, rounded up per tensor) plus one fp32 scale per block of
    ``block_size`` values, or one per tensor when ``block_size`` is 0. For a
    whole model, spread over ``tensors`` tensors, the rounding is per tensor;
    at the sizes planned here it is negligible.
    """
    if compression not in BYTES_PER_VALUE:
        raise ConfigError(f"compression: must be one of {', '.join(BYTES_PER_VALUE)}, "
                          f"got {compression!r}")
    per_tensor = params / tensors
    if compression in ("fp32", "bf16", "fp16"):
        return BYTES_PER_VALUE[compression] * params
    values = per_tensor if compression == "int8" else math.ceil(per_tensor / 2)
    scales = math.ceil(per_tensor / block_size) if block_size > 0 else 1
    return tensors * (values + SCALE_BYTES * scales)


def daily_factors(amplitude: float, peak_hour: float = 14.0) -> np.ndarray:
    """The 24 hourly bandwidth multipliers of ``fedlm.network``'s daily cycle:
    1 − a·(1 + cos(2π(h − peak)/24))/2 at the middle of hour h."""
    hours = np.arange(24) + 0.5
    return 1.0 - amplitude * 0.5 * (1.0 + np.cos(2 * np.pi * (hours - peak_hour) / 24))


# ---------------------------------------------------------------------------
# The inputs
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanInput:
    """What the plan needs. Per-data-centre values are tuples, cycled over the
    data centres (one value: all alike).

    A data centre holds ``workers_per_dc`` workers. Flat (the default), each
    worker is a node of its own, with its own flow on the DC's link to the
    server. ``hierarchical``: the DC's workers train as one data-parallel pod
    (their gradients all-reduced every inner step over ``intra_bw``) and only
    the pod talks to the server — as ``network.hierarchical`` in the simulator.
    """

    params: float  # P, model parameters
    data_centres: int = 1  # D
    workers_per_dc: int | tuple[int, ...] = 1  # per data centre, cycled
    step_time: tuple[float, ...] = (1.0,)  # seconds per inner step, per data centre
    H: int = 100  # inner steps per job (per outer step of a worker)
    latency: tuple[float, ...] = (0.05,)  # one-way seconds per transfer, per data centre
    down_bw: tuple[float, ...] = (1.25e8,)  # server -> worker, bytes/s per flow
    up_bw: tuple[float, ...] = (1.25e8,)  # worker -> server, bytes/s per flow
    server_down: float = 0.0  # server egress shared by all downloads, bytes/s (0: unlimited)
    server_up: float = 0.0  # server ingress shared by all uploads, bytes/s (0: unlimited)
    compression: str = "fp32"  # how uploads are encoded
    block_size: int = 256  # values per int8/int4 scale (0: one per tensor)
    down_compression: str = "fp32"  # how the global model is sent (the simulator: fp32)
    jitter: float = 0.0  # sigma of the lognormal multiplier on compute time
    daily_amplitude: float = 0.0  # bandwidth dips by this fraction once a day (0: off)
    peak_hour: float = 14.0
    hierarchical: bool = False  # a DC's workers are one data-parallel pod
    intra_bw: float = 12.5e9  # bytes/s inside a data centre (the pod's all-reduce)
    tensors: int = 1  # tensors the model is split into (int4 rounding, per-tensor scales)

    def __post_init__(self) -> None:
        if isinstance(self.workers_per_dc, int):
            object.__setattr__(self, "workers_per_dc", (self.workers_per_dc,))

    def members(self) -> np.ndarray:
        """Workers in each data centre."""
        k = self.workers_per_dc
        return np.array([k[d % len(k)] for d in range(self.data_centres)], float)

    @property
    def workers(self) -> int:
        return int(self.members().sum())

    @property
    def nodes(self) -> int:
        """What talks to the server: every worker, or one pod per data centre."""
        return self.data_centres if self.hierarchical else self.workers

    def check(self) -> PlanInput:
        """Refuse impossible inputs with a one-line ``ConfigError``."""
        def need(ok: bool, name: str, value, why: str) -> None:
            if not ok:
                raise ConfigError(f"{name}: {why}, got {value!r}")

        need(math.isfinite(self.params) and self.params >= 1, "params", self.params,
             "must be a number of parameters >= 1")
        need(self.data_centres >= 1, "data_centres", self.data_centres, "must be >= 1")
        need(len(self.workers_per_dc) >= 1 and min(self.workers_per_dc) >= 1,
             "workers_per_dc", self.workers_per_dc, "must be >= 1")
        need(self.data_centres <= 1_000_000 and self.workers <= 10_000_000, "workers",
             self.workers, "must be <= 10,000,000 in all")
        need(self.H >= 1, "H", self.H, "must be >= 1")
        for name in ("step_time", "down_bw", "up_bw", "latency"):
            values = getattr(self, name)
            need(len(values) >= 1, name, values, "needs at least one value")
            for v in values:
                ok = math.isfinite(v) and (v >= 0 if name == "latency" else v > 0)
                need(ok, name, v, "must be >= 0" if name == "latency" else "must be > 0")
        for name in ("server_down", "server_up"):
            v = getattr(self, name)
            need(math.isfinite(v) and v >= 0, name, v, "must be >= 0 (0: unlimited)")
        for name in ("compression", "down_compression"):
            v = getattr(self, name)
            need(v in BYTES_PER_VALUE, name, v, f"must be one of {', '.join(BYTES_PER_VALUE)}")
        need(self.block_size >= 0, "block_size", self.block_size, "must be >= 0")
        need(math.isfinite(self.jitter) and 0 <= self.jitter <= 3, "jitter", self.jitter,
             "must be in [0, 3]")
        need(0 <= self.daily_amplitude < 1, "daily_amplitude", self.daily_amplitude,
             "must be in [0, 1)")
        need(math.isfinite(self.intra_bw) and self.intra_bw > 0, "intra_bw", self.intra_bw,
             "must be > 0")
        need(self.tensors >= 1, "tensors", self.tensors, "must be >= 1")
        return self

    # -- derived quantities -----------------------------------------------------
    def down_bytes(self) -> float:
        return payload_bytes(self.params, self.down_compression, self.block_size, self.tensors)

    def up_bytes(self) -> float:
        return payload_bytes(self.params, self.compression, self.block_size, self.tensors)

    def classes(self) -> Classes:
        """The nodes, grouped into classes of identical ones (same step time,
        latency, links, pod size): everything below is computed per class, so
        100,000 identical workers cost what one does."""
        lists = [self.step_time, self.latency, self.down_bw, self.up_bw, self.workers_per_dc]
        period = math.lcm(*(len(v) for v in lists))  # DC d looks like DC d mod period
        counts: dict[tuple, int] = {}
        for d in range(min(period, self.data_centres)):
            key = tuple(float(v[d % len(v)]) for v in lists)
            # DCs d, d + period, d + 2·period, ... below D
            counts[key] = counts.get(key, 0) + len(range(d, self.data_centres, period))
        keys = sorted(counts)
        rows = np.array(keys, float)
        dcs = np.array([counts[k] for k in keys], float)
        members = rows[:, 4]
        if self.hierarchical:
            # one node per DC; a ring all-reduce moves 2(k-1)/k of the (fp32) model
            # through each member's link every inner step
            allreduce = 2 * (members - 1) / members * 4.0 * self.params / self.intra_bw
            count = dcs
        else:
            allreduce = np.zeros(len(keys))
            count = dcs * members
        return Classes(count=count, step_time=rows[:, 0], latency=rows[:, 1],
                       down_bw=rows[:, 2], up_bw=rows[:, 3], allreduce=allreduce)


@dataclass(frozen=True)
class Classes:
    """Nodes grouped by profile: ``count[c]`` nodes alike in class c."""

    count: np.ndarray
    step_time: np.ndarray
    latency: np.ndarray
    down_bw: np.ndarray
    up_bw: np.ndarray
    allreduce: np.ndarray  # seconds per inner step spent in the pod's all-reduce (0: flat)

    def compute(self, H: int, jitter: float) -> tuple[np.ndarray, np.ndarray]:
        """(mean, median) compute seconds of a job: H × (step × jitter + all-reduce);
        the jitter multiplier is lognormal with median 1 and mean e^{σ²/2}."""
        return (H * (self.step_time * math.exp(jitter ** 2 / 2) + self.allreduce),
                H * (self.step_time + self.allreduce))


def from_config(cfg, params: float, tensors: int = 1) -> PlanInput:
    """The plan of a fedlm run config (fleet, H, network), for a model of
    ``params`` fp32 values spread over ``tensors`` tensors: one data centre per
    node the engine schedules (a worker, or a hierarchical region's pod)."""
    from fedlm import fleet

    net = cfg.network
    nodes = fleet.node_profiles(cfg)
    return PlanInput(
        params=float(params), data_centres=len(nodes),
        workers_per_dc=tuple(p.members for p in nodes),
        step_time=tuple(p.step_time for p in nodes), H=cfg.inner.steps,
        latency=tuple(p.region.latency for p in nodes),
        down_bw=tuple(p.region.down_bw for p in nodes),
        up_bw=tuple(p.region.up_bw for p in nodes),
        server_down=net.server_down, server_up=net.server_up, compression=net.compression,
        block_size=net.block_size, jitter=cfg.fleet.jitter,
        daily_amplitude=net.daily_amplitude, peak_hour=net.peak_hour,
        hierarchical=net.hierarchical, intra_bw=net.intra_bw, tensors=tensors)


# ---------------------------------------------------------------------------
# Sharing a link
# ---------------------------------------------------------------------------

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
    (``fedlm.network``), solved event by event.
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
    xfer = {d: nbytes / cap for d, (cap, _, nbytes) in links.items()}  # at full rate
    crowd = {d: np.ones(len(k)) for d in links}
    contended = inp.server_down > 0 or inp.server_up > 0
    p = {d: np.zeros(len(k)) for d in links}  # share of time a worker is transferring
    for _ in range(iterations if contended else 0):
        new_xfer = {}
        for d, (cap, server, nbytes) in links.items():
            # row j: the flows a transfer of class j sees (its own class on the diagonal)
            weights = np.tile(k * p[d], (len(k), 1))
            np.fill_diagonal(weights, k if inp.jitter == 0 else 1 + (k - 1) * p[d])
            rate = np.minimum(cap, water_level(weights, cap, server))
            crowd[d] = weights.sum(axis=1)
            new_xfer[d] = nbytes / rate
        cycle = new_xfer["down"] + new_xfer["up"] + 2 * c.latency + comp
        new_p = {d: new_xfer[d] / cycle for d in links}
        delta = max(float(np.max(np.abs(new_p[d] - p[d]))) for d in links)
        p = {d: 0.5 * p[d] + 0.5 * new_p[d] for d in links}
        xfer = new_xfer
        if delta < 1e-9:
            break
    return Phases(k, xfer["down"] + c.latency, comp, xfer["up"] + c.latency, np.zeros(len(k)),
                  crowd_down=float(np.average(crowd["down"], weights=k)),
                  crowd_up=float(np.average(crowd["up"], weights=k)))


# ---------------------------------------------------------------------------
# Predictions
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Prediction:
    """One strategy family's outlook. Fractions are of all workers' time."""

    mode: str  # "sync" | "async"
    time_per_update: float  # seconds between new global models (sync: a round)
    time_per_round: float  # sync: a round; async: N arrivals (one per worker on average)
    compute_utilisation: float  # share of worker-time spent computing
    comm_fraction: float  # share spent downloading/uploading (latency, link waits included)
    idle_fraction: float  # share spent waiting for others (sync's barrier; async: 0)
    download: float  # mean seconds per job: download
    compute: float  # mean seconds per job: compute
    upload: float  # mean seconds per job: upload
    crowd_down: float  # transfers sharing the server's egress, as a transfer sees it
    crowd_up: float

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


# ---------------------------------------------------------------------------
# Crossovers: when is the network fast enough?
# ---------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------

def human(x: float, unit: str = "", base: float = 1000.0) -> str:
    """1.5e9 -> '1.5 G' (+unit)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g} {unit}".strip()
    prefixes = ["", "k", "M", "G", "T", "P", "E"]
    k = max(0, min(len(prefixes) - 1, math.floor(math.log(abs(x), base))))
    return f"{x / base ** k:.3g} {prefixes[k]}{unit}".strip()


def seconds(x: float) -> str:
    if not math.isfinite(x):
        return "inf"
    if x < 1e-3:
        return f"{x * 1e6:.3g} µs"
    if x < 1:
        return f"{x * 1e3:.3g} ms"
    if x < 120:
        return f"{x:.3g} s"
    if x < 7200:
        return f"{x / 60:.3g} min"
    if x < 172800:
        return f"{x / 3600:.3g} h"
    return f"{x / 86400:.3g} d"


def describe(inp: PlanInput) -> str:
    """One paragraph of what was planned."""
    def vals(name, fmt):
        v = sorted(set(getattr(inp, name)))
        if len(v) > 4:
            return f"{fmt(v[0])}..{fmt(v[-1])}"
        return "/".join(fmt(x) for x in v)

    link = (f"links {vals('down_bw', lambda b: human(8 * b, 'bit/s'))} down, "
            f"{vals('up_bw', lambda b: human(8 * b, 'bit/s'))} up, "
            f"latency {vals('latency', seconds)}")
    server = ("server link unlimited" if not (inp.server_down or inp.server_up) else
              f"server link {human(8 * inp.server_down, 'bit/s') if inp.server_down else 'unlimited'}"
              f" down, {human(8 * inp.server_up, 'bit/s') if inp.server_up else 'unlimited'} up")
    per_dc = vals("workers_per_dc", str)
    pods = (f" as one pod each (all-reduce at {human(8 * inp.intra_bw, 'bit/s')})"
            if inp.hierarchical else "")
    return (f"{human(inp.params)} parameters, {inp.data_centres} data centre(s) x "
            f"{per_dc} worker(s){pods}, H = {inp.H} steps of "
            f"{vals('step_time', seconds)}, {link}; {server}; upload "
            f"{inp.compression} ({human(inp.up_bytes(), 'B')}), download {inp.down_compression} "
            f"({human(inp.down_bytes(), 'B')})"
            + (f", jitter {inp.jitter:g}" if inp.jitter else "")
            + (f", daily bandwidth dip {inp.daily_amplitude:.0%}" if inp.daily_amplitude else ""))


def table(inp: PlanInput, preds: dict[str, Prediction] | None = None) -> str:
    """The plan as a text table, sync beside async, with the crossovers."""
    preds = preds or predict(inp)
    rows = [
        ("time per outer step (sync: round; async: arrival)",
         lambda p: seconds(p.time_per_update)),
        (f"time for N = {inp.nodes} updates", lambda p: seconds(p.time_per_round)),
        ("outer steps per hour", lambda p: f"{p.updates_per_hour:,.1f}"),
        ("compute utilisation", lambda p: f"{p.compute_utilisation:.1%}"),
        ("communication fraction", lambda p: f"{p.comm_fraction:.1%}"),
        ("idle fraction", lambda p: f"{p.idle_fraction:.1%}"),
        ("download per job", lambda p: seconds(p.download)),
        ("compute per job", lambda p: seconds(p.compute)),
        ("upload per job", lambda p: seconds(p.upload)),
    ]
    if inp.server_down or inp.server_up:
        rows.append(("transfers sharing the server (down/up)",
                     lambda p: f"{p.crowd_down:.1f} / {p.crowd_up:.1f}"))
    width = max(len(r[0]) for r in rows)
    lines = [describe(inp), "",
             f"{'':<{width}}  {'sync':>14}  {'async':>14}",
             f"{'':<{width}}  {'(diloco,fedavg)':>14}  {'(async-sgd,..)':>14}"]
    for label, fmt in rows:
        lines.append(f"{label:<{width}}  {fmt(preds['sync']):>14}  {fmt(preds['async']):>14}")
    lines.append("")

    def size(x: float) -> str:
        return ("never (below 1e16)" if x == math.inf else "any size (above 1e3)" if x == 0
                else f"{human(x)} parameters")

    for mode, c in crossovers(inp).items():
        bw = c["bandwidth_10pct"]
        need = ("no bandwidth is enough" if bw == math.inf else
                f"needs >= {human(8 * bw, 'bit/s')} on its slowest link")
        lines.append(f"{mode:>5}: communication = compute at {size(c['params_equal'])}; "
                     f"<= 10% of busy time up to {size(c['params_10pct'])}; this model "
                     f"{need} for <= 10%")
    return "\n".join(lines)


def crossovers(inp: PlanInput) -> dict[str, dict[str, float]]:
    """Per mode: the model size where communication = compute, the largest one
    at <= 10% communication, and the bandwidth this model needs for <= 10%."""
    return {mode: {"params_equal": crossover_params(inp, mode, 0.5),
                   "params_10pct": crossover_params(inp, mode, 0.1),
                   "bandwidth_10pct": bandwidth_needed(inp, mode, 0.1)}
            for mode in ("sync", "async")}


# ---------------------------------------------------------------------------
# CLI values
# ---------------------------------------------------------------------------

_UNITS = {"bit": 1 / 8, "bps": 1 / 8, "b": 1 / 8, "byte": 1.0, "B": 1.0}
_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_bandwidth(text: str, what: str = "--bandwidth") -> float:
    """A bandwidth in bytes/s from '1e9' (bits/s), '10Gbit', '10Gbps', '1.25GB' (bytes/s),
    '0' (unlimited, where allowed); an optional trailing '/s'."""
    import re

    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([kKMGTP]?)(bit|bps|b|byte|B)?(/s)?\s*", text)
    try:
        value = float(m.group(1)) if m else math.nan
    except ValueError:
        value = math.nan
    if not m or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{what}: expected a bandwidth like 1e9 (bit/s), 10Gbit or 1.25GB/s, "
                          f"got {text!r}")
    unit = m.group(3) or "bit"
    return value * _PREFIX[m.group(2)] * _UNITS[unit]


def parse_list(text: str, what: str, parse=float) -> tuple:
    """'0.5' or '0.5,1,2' -> a tuple (per data centre, cycled)."""
    items = [t for t in text.split(",")]
    try:
        values = tuple(parse(t) for t in items)
    except ConfigError:
        raise
    except ValueError:
        raise ConfigError(f"{what}: expected a number or a comma-separated list, "
                          f"got {text!r}") from None
    if not values:
        raise ConfigError(f"{what}: expected at least one value, got {text!r}")
    return values


def input_from_args(args) -> PlanInput:
    """A checked ``PlanInput`` from ``fedlm plan``'s arguments (bandwidths in bits/s)."""
    from fedlm import fleet

    workers = args.workers
    if workers < 1:
        raise ConfigError(f"--workers: must be >= 1, got {workers}")
    dcs = args.data_centres if args.data_centres is not None else workers
    if dcs < 1:
        raise ConfigError(f"--data-centres: must be >= 1, got {dcs}")
    if workers % dcs:
        raise ConfigError(f"--workers: {workers} workers do not spread evenly over {dcs} "
                          f"data centres")
    for flag, value in (("--compression", args.compression),
                        ("--down-compression", args.down_compression)):
        if value not in BYTES_PER_VALUE:
            raise ConfigError(f"{flag}: must be one of {', '.join(BYTES_PER_VALUE)}, "
                              f"got {value!r}")

    def bw(text, what):
        return parse_list(text, what, lambda t: parse_bandwidth(t, what))

    if args.regions is not None:
        names = parse_list(args.regions, "--regions", str)
        for name in names:
            if name.strip() not in fleet.REGIONS:
                raise ConfigError(f"--regions: unknown region {name.strip()!r} "
                                  f"(known: {', '.join(fleet.REGIONS)})")
        regions = [fleet.REGIONS[n.strip()] for n in names]
        latency = tuple(r.latency for r in regions)
        down = tuple(r.down_bw for r in regions)
        up = tuple(r.up_bw for r in regions)
    else:
        latency = parse_list(args.latency, "--latency")
        down = bw(args.down_bandwidth or args.bandwidth, "--down-bandwidth"
                  if args.down_bandwidth else "--bandwidth")
        up = bw(args.up_bandwidth or args.bandwidth, "--up-bandwidth"
                if args.up_bandwidth else "--bandwidth")
    server_down = parse_bandwidth(args.server_down or args.server_bandwidth,
                                  "--server-down" if args.server_down else "--server-bandwidth")
    server_up = parse_bandwidth(args.server_up or args.server_bandwidth,
                                "--server-up" if args.server_up else "--server-bandwidth")
    inp = PlanInput(
        params=parse_count(args.params), data_centres=dcs, workers_per_dc=workers // dcs,
        step_time=parse_list(args.step_time, "--step-time"), H=args.H, latency=latency,
        down_bw=down, up_bw=up, server_down=server_down, server_up=server_up,
        compression=args.compression, down_compression=args.down_compression,
        block_size=args.block_size, jitter=args.jitter, daily_amplitude=args.daily_amplitude,
        hierarchical=args.hierarchical,
        intra_bw=parse_bandwidth(args.intra_bandwidth, "--intra-bandwidth"))
    try:
        return inp.check()
    except ConfigError as exc:  # name the flag, not the field
        field_name, _, rest = str(exc).partition(":")
        raise ConfigError(f"{_FLAGS.get(field_name, field_name)}:{rest}") from None


_FLAGS = {"step_time": "--step-time", "H": "--H", "latency": "--latency",
          "down_bw": "--down-bandwidth", "up_bw": "--up-bandwidth", "workers": "--workers",
          "block_size": "--block-size", "jitter": "--jitter",
          "daily_amplitude": "--daily-amplitude", "params": "--params",
          "intra_bw": "--intra-bandwidth"}


def parse_count(text: str, what: str = "--params") -> float:
    """'1e9', '7B', '70b', '10M', '100T', '1.5k' -> a number."""
    import re

    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([kKmMbBgGtT]?)\s*", text)
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    try:
        value = float(m.group(1)) * scale[m.group(2).lower()] if m else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 1:
        raise ConfigError(f"{what}: expected a number of parameters like 1e9 or 7B, "
                          f"got {text!r}")
    return value


def input_dict(inp: PlanInput) -> dict:
    from dataclasses import asdict

    d = asdict(inp)
    return {**d, "workers": inp.workers, "down_bytes": inp.down_bytes(),
            "up_bytes": inp.up_bytes()}


def prediction_dict(p: Prediction) -> dict:
    from dataclasses import asdict

    return {**asdict(p), "updates_per_hour": p.updates_per_hour}


def jsonable(value):
    """``value`` with inf/nan as None (JSON has neither) and tuples as lists."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def report_dict(inp: PlanInput, preds: dict[str, Prediction] | None = None) -> dict:
    """Everything ``fedlm plan --json`` prints: the input, both predictions and
    the crossovers (None where there is none: never, or at any size)."""
    preds = preds or predict(inp)
    return jsonable({"input": input_dict(inp),
                     **{m: prediction_dict(p) for m, p in preds.items()},
                     "crossovers": crossovers(inp)})


# ---------------------------------------------------------------------------
# Checking the model against the simulator
# ---------------------------------------------------------------------------

def simulate(cfg, params: int) -> dict[str, float]:
    """Run fedlm's real engine on ``cfg`` with a model of ``params`` fp32 values
    (one tensor) and a transport that answers every job at once with a zero
    outer gradient, so that only the virtual clock matters. Returns what the
    plan predicts: virtual seconds per new global model, and the shares of all
    workers' time spent computing, communicating (link waits included) and idle.

    Needs torch (imported here only); the rest of this module does not.
    """
    from collections import OrderedDict

    import torch

    from fedlm import compression, fleet
    from fedlm.engine import Engine, Reply
    from strategies import registry

    zeros = OrderedDict(w=torch.zeros(int(params)))
    payload, _ = compression.encode(zeros, {}, cfg.network)

    class Instant:  # every job done the moment it is submitted
        def __init__(self) -> None:
            self.ready: list = []

        def submit(self, job, params_) -> None:
            self.ready.append(Reply(job.job_id, payload, steps=job.local_steps, tokens=1,
                                    train_loss=0.0))

        def collect(self, timeout: float) -> list:
            out, self.ready = self.ready, []
            return out

    class Spans:  # a run writer that keeps only the worker intervals
        def __init__(self) -> None:
            self.seconds: dict[str, float] = {}

        def add_intervals(self, rows) -> None:
            for _, kind, t0, t1, *_ in rows:
                key = getattr(kind, "value", kind)
                self.seconds[key] = self.seconds.get(key, 0.0) + (t1 - t0)

        def __getattr__(self, name):  # every other call of the engine's writer
            return lambda *a, **k: None

    spans = Spans()
    nodes = fleet.node_profiles(cfg)
    engine = Engine(cfg, strategy=registry.build_strategy(cfg.strategy, cfg.outer),
                    local_steps=registry.build_local_steps(cfg.local_steps),
                    transport=Instant(), fleet=nodes, writer=spans)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: threads only get in each other's way
    try:
        engine.run(zeros)
    finally:
        torch.set_num_threads(threads)
    total = engine.now * len(nodes)
    sec = spans.seconds
    comm = sec.get("download", 0.0) + sec.get("upload", 0.0) + sec.get("link wait", 0.0)
    return {"time_per_update": engine.now / engine.version, "virtual_time": engine.now,
            "updates": engine.version, "compute_utilisation": sec.get("compute", 0.0) / total,
            "comm_fraction": comm / total, "idle_fraction": sec.get("idle", 0.0) / total}
