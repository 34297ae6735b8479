"""Fewer bytes only where the link is slow (``network.slow_compression``).

One encoding for every upload (``network.compression``) spends quality on workers whose
links are fast enough to send fp32 behind nothing. With ``slow_compression`` set, a
worker whose whole-model exchange outlasts its compute,

    X_w = (latency + model bytes / down_bw) + (latency + update bytes / up_bw)  >  H · s_w

(its own link, the profile's nominal step time s_w, the configured H, the update as
``network.compression`` sends it), encodes its uploads with ``slow_compression``
instead (``int4``, ``int8``, ``bf16``, or a codec of your own such as
``muloco:TwoBit``); the others keep ``network.compression``. Which workers is decided
once, at the server's start, from the fleet's profiles: a run, its replay and its resume
choose alike. The job carries its encoding (``JobSpec.compression``): the worker encodes
with it, the engine decodes with it, and the simulator times its bytes.

The one-server kind chooses (``fedlm.servers.protocol.Server``); kinds that send or
time their own jobs (streamed, region servers, the overlapped and eager plug-ins:
``fedlm.servers.checks``) and a shared server link (whose fluid model moves every
upload at one size) refuse it in one line.
"""

from __future__ import annotations

from dataclasses import replace

from fedlm.config import Config, NetworkConfig
from fedlm.errors import ConfigError
from fedlm.sim.links import transfer_seconds


def slow_workers(fleet: list, model_bytes: int, up_bytes: int, steps: int) -> frozenset[int]:
    """The workers whose whole-model exchange outlasts their ``steps`` steps of compute."""
    def exchange(p) -> float:
        r = p.region
        return (transfer_seconds(model_bytes, r.down_bw, r.latency)
                + transfer_seconds(up_bytes, r.up_bw, r.latency))
    return frozenset(p.worker for p in fleet if exchange(p) > steps * p.step_time)


def network_of(net: NetworkConfig, job) -> NetworkConfig:
    """The network settings ``job``'s upload is encoded and decoded with."""
    return replace(net, compression=job.compression) if job.compression else net


def check(cfg: Config) -> None:
    """``network.slow_compression``: a known encoding, on links that can time it (the
    server kind's part is ``fedlm.servers.checks``)."""
    from fedlm.sim import codecs

    n = cfg.network
    if not n.slow_compression:
        return
    try:
        codecs.check(n.slow_compression)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("network.compression", "network.slow_compression",
                                           1)) from None
    where = "network.slow_compression: "
    if n.server_down > 0 or n.server_up > 0 or n.daily_amplitude > 0:
        raise ConfigError(f"{where}a shared server link moves every upload at one size: "
                          f"drop network.server_down, server_up and daily_amplitude")
    if n.topology != "star" or n.hierarchical:
        raise ConfigError(f"{where}per-link encodings are for a star of workers' own links, "
                          f"not network.topology = {n.topology!r} or hierarchical pods")
