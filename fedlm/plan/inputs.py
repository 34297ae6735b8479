"""What a plan is given: ``PlanInput``, and its nodes grouped into ``Classes``.

A plan describes D data centres, each holding one or several workers, with a
step time, a latency and links to the server per data centre (tuples cycled
over the data centres), the server's own shared link, how updates are
encoded, H and the compute jitter. ``PlanInput.check`` refuses impossible
values in one line; ``classes`` groups identical nodes so that everything
downstream is computed once per kind of node. ``from_config`` builds the plan
of a fedlm run config. Bandwidths are bytes per second, like ``fedlm.sim.fleet``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedlm.sim import fleet, quantities as Q
from fedlm.errors import ConfigError
from fedlm.sim.collectives import TOPOLOGIES, intra_step
from fedlm.sim.wire_sizes import BYTES_PER_VALUE, payload_bytes


@dataclass(frozen=True)
class PlanInput:
    """What the plan needs. Per-data-centre values are tuples, cycled over the
    data centres (one value: all alike).

    A data centre holds ``workers_per_dc`` workers. Flat (the default), each
    worker is a node of its own, with its own flow on the DC's link to the
    server. ``hierarchical``: the DC's workers train as one data-parallel pod
    (their gradients all-reduced every inner step over ``intra_bw``) and only
    the pod talks to the server — as ``network.hierarchical`` in the simulator.

    ``topology`` says how the outer gradients are exchanged
    (``fedlm.sim.collectives``): ``star`` (a parameter server), ``ring`` or
    ``tree`` (an all-reduce among the nodes, no server), ``hierarchical``
    (``star`` between pods; the same as ``hierarchical=True``). ``fragments``
    and ``overlap`` are Streaming DiLoCo's P and τ (``fedlm.plan.topology``).
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
    topology: str = "star"  # star | ring | tree | hierarchical (fedlm.sim.collectives)
    fragments: int = 1  # P: the model is exchanged one fragment at a time (Streaming DiLoCo)
    overlap: int = 0  # τ: inner steps of the next segment a fragment's exchange may hide behind

    def __post_init__(self) -> None:
        if isinstance(self.workers_per_dc, int):
            object.__setattr__(self, "workers_per_dc", (self.workers_per_dc,))
        # one idea, two spellings (the simulator's network.hierarchical flag): keep them agreed
        if self.hierarchical and self.topology == "star":
            object.__setattr__(self, "topology", "hierarchical")
        if self.topology == "hierarchical":
            object.__setattr__(self, "hierarchical", True)

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
        need(self.topology in TOPOLOGIES, "topology", self.topology,
             f"must be one of {', '.join(TOPOLOGIES)}")
        need(not (self.hierarchical and self.topology in ("ring", "tree")), "topology",
             self.topology, "cannot be hierarchical as well (hierarchical is a star of pods)")
        need(1 <= self.fragments <= self.H, "fragments", self.fragments,
             f"must be between 1 and H = {self.H}")
        need(self.H % self.fragments == 0, "fragments", self.fragments,
             f"must divide H = {self.H} (segments of H/P inner steps)")
        need(0 <= self.overlap < self.H // self.fragments, "overlap", self.overlap,
             f"must be >= 0 and < H/P = {self.H // self.fragments} inner steps (an exchange "
             f"must end within the segment after it)")
        return self

    def check_quantities(self) -> PlanInput:
        """``check``, and every step time, link and latency in the ranges a run's fleet
        has (``fedlm.sim.quantities``: the same words), for what a user gave; the
        planner's own searches (crossovers) go past them on purpose."""
        kinds = {"step_time": Q.STEP, "down_bw": Q.BANDWIDTH, "up_bw": Q.BANDWIDTH,
                 "latency": Q.LATENCY}
        for name, quantity in kinds.items():
            for v in getattr(self, name):
                quantity.check(name, v)
        self.check()
        for name in ("server_down", "server_up"):
            if getattr(self, name) != 0:  # 0: unlimited
                Q.BANDWIDTH.check(name, getattr(self, name))
        Q.BANDWIDTH.check("intra_bw", self.intra_bw)
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
            allreduce = np.array([intra_step(4.0 * self.params, int(k), self.intra_bw)
                                  for k in members])
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
    from fedlm.strategies.fragments import Streaming

    net = cfg.network
    nodes = fleet.node_profiles(cfg)
    stream = Streaming.of_config(cfg)
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
        hierarchical=net.hierarchical, intra_bw=net.intra_bw, tensors=tensors,
        topology=net.topology, fragments=stream.fragments if stream else 1,
        overlap=stream.overlap if stream else 0)
