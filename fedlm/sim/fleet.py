"""Hardware and network profiles of the workers, and the durations they imply.

A worker has a compute speed (seconds per inner step), a seeded lognormal
jitter on each job's compute time, and a region whose link to the server has a
latency and separate down/up bandwidths. From these the engine knows, at
dispatch, exactly how long a job will take in virtual time:

    download = latency + model_bytes / down_bw
    compute  = steps × step_time × jitter      (jitter ~ LogNormal(0, σ), mean-free in log)
    upload   = latency + update_bytes / up_bw

Profiles are addressed by partition id (worker index): Flower's simulation
engine gives a node nothing but ``partition-id`` and ``num-partitions``. In
hierarchical mode (``network.hierarchical``) a node is a region's pod: its
workers train data-parallel (all-reduce every step over ``network.intra_bw``)
and only the pod talks to the server (``groups``, ``node_profiles``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

from fedlm.config import Config, FleetConfig
from fedlm.sim import collectives, geo, quantities as Q
from fedlm.sim.links import GBIT, hidden_seconds, transfer_seconds


@dataclass(frozen=True)
class Region:
    name: str
    latency: float  # one-way latency to the server, seconds
    down_bw: float  # server -> worker bandwidth, bytes per second
    up_bw: float  # worker -> server bandwidth, bytes per second
    intra_bw: float = 0.0  # inside the region, bytes per second (0: network.intra_bw)


# The server sits in us-east. Latencies are one-way, round numbers of public
# inter-region measurements; WAN bandwidths are per-flow figures a training job
# could expect, not the data centres' aggregate capacity.
REGIONS: dict[str, Region] = {
    "local": Region("local", 0.0005, 10 * GBIT, 10 * GBIT),  # same data centre
    "us": Region("us", 0.010, 2 * GBIT, 1 * GBIT),  # us-west <-> us-east
    "eu": Region("eu", 0.040, 1 * GBIT, 0.5 * GBIT),  # europe <-> us-east
    "asia": Region("asia", 0.090, 0.5 * GBIT, 0.2 * GBIT),  # asia <-> us-east
}


@dataclass(frozen=True)
class WorkerProfile:
    worker: int
    step_time: float  # nominal virtual seconds per inner step
    jitter: float  # sigma of the lognormal compute-time multiplier
    region: Region
    members: int = 1  # hierarchical: workers of the region training as one pod


@dataclass(frozen=True)
class JobTiming:
    """A job's virtual durations. Star topology: download, compute, upload. An
    all-reduce (``network.topology`` ring or tree) or a streaming round instead
    has an ``exchange``: the part of the collective the worker waits for, after
    ``before_exchange`` seconds of its compute (all of it, without streaming;
    τ steps' worth with Streaming DiLoCo's overlap), while ``hidden`` seconds of
    the exchange ran behind that compute."""

    download: float
    compute: float
    upload: float
    exchange: float = 0.0  # exposed collective seconds (the worker waits)
    before_exchange: float = 0.0  # compute seconds before the exposed exchange
    hidden: float = 0.0  # collective seconds overlapped by compute

    @property
    def total(self) -> float:
        return self.download + self.compute + self.upload + self.exchange


# Heterogeneity levels: worker speeds spread geometrically from 1× to R× the
# base step time (R below), the slowest being R times slower than the fastest.
_SPREAD = {"homogeneous": 1.0, "slight": 1.5, "moderate": 3.0, "very": 10.0}
# The authors' public toy example: seconds per step of four workers.
_PAPER_TOY = [0.58, 0.75, 1.51, 3.33]
PRESETS = ("homogeneous", "slight", "moderate", "very", "paper-toy", "geo", "halos")


def _preset_step_times(cfg: FleetConfig, n: int) -> list[float]:
    if cfg.preset == "paper-toy":
        return [_PAPER_TOY[w % len(_PAPER_TOY)] for w in range(n)]
    spread = _SPREAD.get(cfg.preset, 1.0)  # geo: homogeneous compute, varied links
    if n == 1:
        return [cfg.base_step_time]
    return [cfg.base_step_time * spread ** (w / (n - 1)) for w in range(n)]


def _preset_regions(cfg: FleetConfig, n: int) -> list[str]:
    if cfg.preset == "halos":
        return geo.halos_placement(n)
    if cfg.preset == "geo":
        return [("us", "eu", "asia")[w % 3] for w in range(n)]
    return ["local"] * n


def regions_of(cfg: FleetConfig) -> dict[str, Region]:
    """The built-in regions plus the config's own (``fleet.links``, ``fleet.matrix``)."""
    matrix = geo.matrix_regions(geo.matrix_of(cfg.preset, cfg.matrix))
    return {**REGIONS, **{name: Region(name, float(v["latency"]), float(v["down_bw"]),
                                       float(v["up_bw"])) for name, v in cfg.links.items()},
            **{name: Region(name, *link) for name, link in matrix.items()}}


def profiles(cfg: FleetConfig, num_workers: int, batch_size: int = 8) -> list[WorkerProfile]:
    """Each worker's profile: the preset, with explicit lists taking precedence
    (``topology`` places workers in regions in order: {us = 4, eu = 2} -> 0-3 us, 4-5 eu).
    A FedScale device trace (``fleet.device_trace``) sets every worker's step time (at
    ``batch_size`` sequences a step) and link instead (``fedlm.sim.traces``)."""
    if cfg.device_trace:
        return _traced_profiles(cfg, num_workers, batch_size)
    step_times = _preset_step_times(cfg, num_workers)
    regions = _preset_regions(cfg, num_workers)
    for w in range(min(num_workers, len(cfg.step_times))):
        step_times[w] = cfg.step_times[w]
    for w in range(min(num_workers, len(cfg.regions))):
        regions[w] = cfg.regions[w]
    if cfg.topology:
        regions = [name for name, count in cfg.topology.items() for _ in range(count)]
    if cfg.preset == "halos":  # each region's workers at HALoS's speeds for it
        step_times = geo.halos_step_times(regions, cfg.base_step_time)
        for w in range(min(num_workers, len(cfg.step_times))):
            step_times[w] = cfg.step_times[w]
    known = regions_of(cfg)
    return [WorkerProfile(w, step_times[w], cfg.jitter, known[regions[w]])
            for w in range(num_workers)]


def _traced_profiles(cfg: FleetConfig, num_workers: int, batch_size: int
                     ) -> list[WorkerProfile]:
    """Worker w is the trace's (w mod clients)-th client in key order, as FedScale hands
    out its traces: FedScale's compute time per step (3 x batch x ms per sample) and its
    bandwidth both ways, no latency (FedScale has none); each worker a region of its own."""
    entries = _device_entries(cfg.device_trace)
    out = []
    for w in range(num_workers):
        e = entries[w % len(entries)]
        # the trace's numbers as the fleet's quantities, checked as the config's are
        where = f"fleet.device_trace: client {e.key}"
        step = Q.check_derived(where, f"'computation' {e.computation:g} ms/sample at batch "
                               f"{batch_size}", e.step_seconds(batch_size), Q.STEP)
        bw = Q.check_derived(where, f"'communication' {e.communication:g} kbit/s",
                             e.bytes_per_second(), Q.BANDWIDTH)
        out.append(WorkerProfile(w, step, cfg.jitter, Region(f"trace-{e.key}", 0.0, bw, bw)))
    return out


def _device_entries(path: str) -> list:
    """A device trace's entries, read once per file version: every job of a hierarchical
    run, and every check of a config, asks for the fleet's profiles again."""
    try:
        st = os.stat(path)
        version = (st.st_mtime_ns, st.st_size)
    except OSError:
        version = None  # the read below says what is wrong with it
    return _read_device_trace(path, version)


@functools.lru_cache(maxsize=8)
def _read_device_trace(path: str, version) -> list:
    from fedlm.sim import traces  # only runs that name a trace read one

    return traces.load_device_trace(path)


def groups(cfg: Config) -> list[list[int]]:
    """The workers behind each engine-level node: themselves, or (hierarchical)
    the workers of each region, regions in order of their first worker."""
    per_worker = profiles(cfg.fleet, cfg.workers, cfg.inner.batch_size)
    if not cfg.network.hierarchical:
        return [[p.worker] for p in per_worker]
    return by_region(per_worker)


def by_region(fleet: list[WorkerProfile]) -> list[list[int]]:
    """The workers of each region, regions in order of their first worker (hierarchical
    pods; a two-level strategy's region servers)."""
    members: dict[str, list[int]] = {}
    for p in fleet:
        members.setdefault(p.region.name, []).append(p.worker)
    return list(members.values())


def node_count(cfg: Config) -> int:
    """Workers as the engine and Flower see them: one per region if hierarchical."""
    if not cfg.network.hierarchical:
        return cfg.workers
    return len(groups(cfg))


def node_profiles(cfg: Config) -> list[WorkerProfile]:
    """The profiles the engine schedules: one per worker, or one per region pod
    (as slow as its slowest member, its members' batches all-reduced every step)."""
    per_worker = profiles(cfg.fleet, cfg.workers, cfg.inner.batch_size)
    if not cfg.network.hierarchical:
        return per_worker
    return [WorkerProfile(n, max(per_worker[w].step_time for w in members), cfg.fleet.jitter,
                          per_worker[members[0]].region, members=len(members))
            for n, members in enumerate(groups(cfg))]


def _download(p: WorkerProfile, nbytes: int) -> float:
    return transfer_seconds(nbytes, p.region.down_bw, p.region.latency)


def _upload(p: WorkerProfile, nbytes: int) -> float:
    return transfer_seconds(nbytes, p.region.up_bw, p.region.latency)


class JobTimer:
    """Virtual durations of jobs; one seeded RNG per worker, so a worker's
    jitter sequence does not depend on the order jobs of others were dispatched."""

    def __init__(self, fleet: list[WorkerProfile], seed: int, intra_bw: float = 12.5e9,
                 topology: str = "star", dynamics=None) -> None:
        self.fleet = fleet
        self.dynamics = dynamics  # fedlm.sim.dynamics.FleetDynamics, or None
        self.intra_bw = intra_bw
        self.topology = topology
        self._rngs = [np.random.default_rng([seed, 7919, p.worker]) for p in fleet]
        # an all-reduce's steps go as fast as the slowest link allows, each paying the
        # largest latency (fedlm.sim.collectives)
        self._bw_min = min(min(p.region.down_bw, p.region.up_bw) for p in fleet)
        self._lat_max = max(p.region.latency for p in fleet)

    def _compute(self, worker: int, steps: int, model_bytes: int) -> float:
        p = self.fleet[worker]
        jitter = float(self._rngs[worker].lognormal(0.0, p.jitter)) if p.jitter > 0 else 1.0
        # A pod of k workers all-reduces its gradients every step: a ring moves
        # 2(k-1)/k of the model through each member's local link.
        allreduce = collectives.intra_step(model_bytes, p.members, self.intra_bw)
        return steps * (p.step_time * jitter + allreduce)

    def changed_compute(self, worker: int, start: float, nominal: float, index: int) -> float:
        """Seconds a compute of ``nominal`` seconds started at ``start`` takes on a fleet
        that changes over time (``fedlm.sim.dynamics``)."""
        straggle = self.dynamics.straggle(worker, index)
        work = nominal * straggle.multiplier if straggle is not None else nominal
        return self.dynamics.compute_end(worker, start, work) - start

    def transfers(self, worker: int, down_bytes: int, up_bytes: int) -> float:
        """Nominal seconds a whole-model job of ``worker`` spends on transfers: its
        download and upload (star), or the all-reduce (ring, tree). ``timing`` times
        every job with these formulas; DyLU sizes jobs with them."""
        if self.topology in collectives.ALLREDUCE:
            return self.allreduce(up_bytes)
        return _download(self.fleet[worker], down_bytes) + _upload(self.fleet[worker], up_bytes)

    def allreduce(self, nbytes: float) -> float:
        """Seconds of one all-reduce of ``nbytes`` among the fleet (ring or tree)."""
        return collectives.allreduce_seconds(self.topology, nbytes, len(self.fleet),
                                             self._bw_min, self._lat_max)

    def timing(self, worker: int, steps: int, down_bytes: int, up_bytes: int,
               start: float = 0.0, index: int = 0) -> JobTiming:
        """A whole-model job dispatched at ``start`` as its worker's ``index``-th:
        download, compute, upload (star), or compute and an all-reduce of the upload
        (ring, tree). A fleet that changes over time stretches the compute over the
        slow spans it meets, and a straggling job's by its multiplier."""
        p = self.fleet[worker]
        compute = self._compute(worker, steps, down_bytes)
        allreduce = self.topology in collectives.ALLREDUCE
        if self.dynamics is not None:
            download = 0.0 if allreduce else _download(p, down_bytes)
            compute = self.changed_compute(worker, start + download, compute, index)
        if allreduce:
            return JobTiming(0.0, compute, 0.0, exchange=self.allreduce(up_bytes),
                             before_exchange=compute)
        return JobTiming(download=_download(p, down_bytes), compute=compute,
                         upload=_upload(p, up_bytes))

    def overlapped_timing(self, worker: int, steps: int, model_bytes: int, down_bytes: int,
                          up_bytes: int, overlap: int) -> JobTiming:
        """A Streaming DiLoCo round's job. The exchange it waits for is the previous
        round's: its fragment's upload (``up_bytes``; 0 on a worker's first job) and
        the new global fragments' download (``down_bytes``), or their all-reduce.
        It runs behind the first ``overlap`` inner steps; what is left of it is
        exposed. ``overlap`` < 0: nothing to overlap (the first job's whole model)."""
        p = self.fleet[worker]
        compute = self._compute(worker, steps, model_bytes)
        if self.topology in collectives.ALLREDUCE:
            exchange = self.allreduce(up_bytes) if up_bytes else 0.0
        else:
            exchange = ((_upload(p, up_bytes) if up_bytes else 0.0)
                        + (_download(p, down_bytes) if down_bytes else 0.0))
        ahead = compute * overlap / steps if overlap > 0 and steps else 0.0  # τ steps
        hidden = hidden_seconds(exchange, ahead)
        return JobTiming(0.0, compute, 0.0, exchange=exchange - hidden,
                         before_exchange=ahead, hidden=hidden)

    def state_dict(self) -> dict:
        return {"rngs": [r.bit_generator.state for r in self._rngs]}

    def load_state_dict(self, state: dict) -> None:
        for r, s in zip(self._rngs, state["rngs"]):
            r.bit_generator.state = s
