"""The cost model of two-level async training across regions (``strategy = "halos"``).

A server in every region; the region's workers loop async jobs against it over
the region's local link; every K (``server.push_every``) region updates since
its last merge, the region pushes its delta to the global server over its own
WAN link; the global server merges the push on arrival (the only event that
makes a new version) and sends the global model straight back; the region
merges it on arrival. Per region r, over its workers w:

    J_w      = down + compute + up            the job cycle over the local link
                                              (``async_cycle``: latency of
                                              REGIONS["local"], network.intra_bw or
                                              the region's intra_bw; nobody waits)
    λ_r      = Σ_w 1/J_w                      region updates per second
    RTT_r    = (lat + 4P / up_bw_r)           the push up the region's WAN link
             + (lat + 4P / down_bw_r)         and the global model back (fp32 both)
    period_r = RTT_r + W_r(K)                 one push to the next
    W_r(K)   = wait from a merge to the K-th region update after it
    1/time_per_update = Σ_r 1/period_r        global merges per second

It is RTT + W, not max(K/λ, RTT): the strategy counts the K updates from the
*merge* (``region_version - merged_version == K``, ``merged_version`` reset when
the global model is back), so a push waits for the round trip of the one
before it and then for K fresh updates; the updates made meanwhile are not
counted. The workers never wait for either (idle 0): compute, communication
and idle shares are those of the workers' job cycles, as ``predict_async``'s.

W_r(K), from the reports' timing (``push_period``):

- no jitter (exact): worker w reports at m·J_w, m = 1, 2, ... (identical workers
  in step, as in the simulator); walk the pushes (``_walk``): the first at the
  K-th report, each next at the K-th report after the previous one + RTT_r;
  period_r = their mean spacing over ``PUSHES`` pushes. A push is timed by a
  report, so the merge falls at a fixed phase of the reports: with one worker,
  period = J·(⌈RTT/J⌉ + K − 1), where a random instant would give RTT + (K − ½)·J;
- with jitter (approximated): the workers keep their mean cycles J_w but drift
  apart, identical ones too, slowly next to a push period. Walk again with each
  worker at its own phase, drawn uniformly (``PHASES`` seeded draws), and
  average the push *rate* over the draws (each arrangement lasts a while);
- with jitter and more than ``MOST`` workers × K in a region, the merge is taken
  as a random instant: for n alike workers of uniform phases, K = q·n + s
  (1 <= s <= n), W = (n/λ)·(q + s/(n+1)) (K/λ for large n); unlike workers as n
  alike ones of cycle n/λ. The error, at most about one gap between reports
  (1/λ ≈ J/n), is small there.

A daily bandwidth cycle (it scales the local and the WAN links, as the simulator
does) is averaged as in ``fedlm.plan.model``: the merge rate per hour, 24 / Σ_h rate_h
(not checked against the simulator: that takes a virtual day). time_per_round is N
merges, N the workers (as ``predict_async``'s: N updates of the evaluated model).
Not covered: DyLU (``local_steps = "dylu"``: every job is H = inner.steps steps
here), hierarchical pods and shared server links (refused for halos anyway), the
start-up (the first push waits for K updates from t = 0) and the pushes dropped
at the end of a run.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from fedlm.errors import ConfigError
from fedlm.plan.inputs import PlanInput
from fedlm.plan.model import Phases, Prediction, _factors, _summarise, async_cycle
from fedlm.sim import fleet
from fedlm.sim.links import transfer_seconds
from fedlm.sim.wire_sizes import payload_bytes

PUSHES = 128  # pushes walked per region: the mean spacing settles well within
PHASES = 64  # with jitter: draws of the workers' phases the push rate is averaged over
MOST = 1024  # with jitter: workers x K beyond which the random-instant wait is used


def _walk(cycle: np.ndarray, weight: np.ndarray, offset: np.ndarray, K: int, rtt: float,
          pushes: int = PUSHES) -> np.ndarray:
    """Mean seconds between a region's pushes when ``weight[i]`` workers (in step)
    report at offset[d, i] + m·cycle[i], m = 1, 2, ... (one row d per draw of
    phases): the first push at the K-th report, each next one at the K-th report
    after the previous push + ``rtt``. Returns one mean spacing per draw."""
    reps = np.arange(1, math.ceil(K / float(np.min(weight))) + 1)  # reports the K-th may need
    rows = np.arange(len(offset))
    w = np.repeat(weight, len(reps))

    def kth_after(t: np.ndarray) -> np.ndarray:  # per draw, the K-th report after t
        m = np.floor((t[:, None] - offset) / cycle)
        times = (offset[..., None] + (m[..., None] + reps) * cycle[:, None]).reshape(len(t), -1)
        order = np.argsort(times, axis=1, kind="stable")
        done = np.cumsum(w[order], axis=1) >= K - 1e-9
        return np.take_along_axis(times, order, axis=1)[rows, np.argmax(done, axis=1)]

    first = t = kth_after(np.zeros(len(offset)))
    for _ in range(pushes):
        t = kth_after(t + rtt)
    return (t - first) / pushes


def _random_wait(n: float, rate: float, K: int) -> float:
    """Expected seconds from a random instant to the K-th report of n alike workers
    of cycle n/rate with independent uniform phases: q cycles + the s-th of n phases."""
    q, s = divmod(K - 1, int(n))
    return (n / rate) * (q + (s + 1) / (n + 1))


def push_period(ph: Phases, K: int, rtt: float, jitter: float) -> float:
    """Seconds from one push of a region to the next: RTT + W(K) (the docstring)."""
    if jitter <= 0:  # identical workers in step: one report of count[c] at once
        return float(_walk(ph.period, ph.count, np.zeros((1, len(ph.count))), K, rtt)[0])
    n = float(np.sum(ph.count))
    if n * K > MOST:
        return rtt + _random_wait(n, float(np.sum(ph.count / ph.period)), K)
    cycle = np.repeat(ph.period, ph.count.astype(int))  # one worker each, own phase
    offset = np.random.default_rng(0).uniform(0.0, 1.0, (PHASES, len(cycle))) * cycle
    spacing = _walk(cycle, np.ones(len(cycle)), offset, K, rtt, PUSHES // 4)
    return 1.0 / float(np.mean(1.0 / spacing))  # a phase lasts a while: average rates


def region_inputs(cfg, params: float, tensors: int = 1):
    """Per region (in order of its first worker): the ``PlanInput`` of its workers on
    their local links to the region server, and its WAN link to the global server."""
    from fedlm.servers.regions import local_links

    net = cfg.network
    if net.hierarchical or net.server_up or net.server_down or net.topology != "star":
        raise ConfigError("network.topology: strategy halos plans without hierarchical "
                          "pods, an all-reduce or a shared server link (each region has "
                          "its own server)")
    nodes = fleet.node_profiles(cfg)
    local = local_links(nodes, net.intra_bw)
    out = []
    for ws in fleet.by_region(nodes):
        links = [local[w].region for w in ws]
        inp = PlanInput(
            params=float(params), data_centres=len(ws), workers_per_dc=1,
            step_time=tuple(nodes[w].step_time for w in ws), H=cfg.inner.steps,
            latency=tuple(r.latency for r in links), down_bw=tuple(r.down_bw for r in links),
            up_bw=tuple(r.up_bw for r in links), compression=net.compression,
            block_size=net.block_size, jitter=cfg.fleet.jitter,
            daily_amplitude=net.daily_amplitude, peak_hour=net.peak_hour, tensors=tensors)
        out.append((inp.check(), nodes[ws[0]].region))
    return out


def push_every(cfg) -> int:
    """K: the region servers' ``push_every`` (``server.push_every``, or HALoS's)."""
    from fedlm import servers
    from fedlm.servers.regions import RegionServers

    if not issubclass(servers.server_class(cfg), RegionServers):
        raise ConfigError(f"strategy: {cfg.strategy!r} has no region servers to plan "
                          f"(predict_regions is for server = 'regions', as halos has)")
    return servers.settings.settings_of(cfg, RegionServers).push_every


def predict_regions(cfg, params: float, tensors: int = 1) -> Prediction:
    """The plan of a ``strategy = "halos"`` config for a model of ``params`` fp32
    values: mode "async", time_per_update = seconds between global merges,
    time_per_round = N merges (N workers, as ``predict_async``'s), fractions and per-job
    seconds of all workers' job cycles, crowd 1 (no shared link)."""
    K = push_every(cfg)
    regions = region_inputs(cfg, params, tensors)
    wan_bytes = payload_bytes(params, "fp32", 0, tensors)  # a delta up, the model down
    factors = _factors(regions[0][0])
    rates, hours = [], []
    for f in factors:
        rate, phases = 0.0, []
        for inp, wan in regions:
            ph = async_cycle(inp, f)
            rtt = (transfer_seconds(wan_bytes, wan.up_bw * f, wan.latency)
                   + transfer_seconds(wan_bytes, wan.down_bw * f, wan.latency))
            rate += 1.0 / push_period(ph, K, rtt, inp.jitter)
            phases.append(ph)
        rates.append(rate)
        hours.append(Phases(*(np.concatenate([getattr(p, k) for p in phases])
                              for k in ("count", "download", "compute", "upload", "idle"))))
    per_update = len(factors) / sum(rates)
    workers = _summarise("async", hours)
    n = sum(inp.workers for inp, _ in regions)
    return replace(workers, time_per_update=per_update, time_per_round=per_update * n,
                   crowd_down=1.0, crowd_up=1.0)
