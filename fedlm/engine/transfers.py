"""A two-level strategy's servers (``fedlm.strategies.halos``): where they sit, how long
their transfers take, and what happens when one arrives.

Each region of the fleet has a region server next to its workers, and the global
server sits where the star topology's server does. So:

    worker <-> its region server   the region's own link (``network.intra_bw``, or
                                   the diagonal of ``fleet.matrix``), not the WAN
    region server <-> global       the region's link to the server (its latency,
                                   ``up_bw`` for a push, ``down_bw`` for the model
                                   coming back), scaled by the daily cycle

``ServerTransfers.send`` starts the transfers the strategy queued, each on the event
clock (virtual, or the wall clock's simulated link time); ``arrived`` hands one back
to the strategy (through the ``GlobalModel``), makes a version if the global model
changed, and logs the arrival as an operation: replay walks it in that order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from fedlm.config import Config
from fedlm.sim.fleet import REGIONS, Region, WorkerProfile, by_region
from fedlm.sim.network import daily_factor

from fedlm.engine.global_model import GlobalModel
from fedlm.engine.runlog import RunLog


def local_links(fleet: list[WorkerProfile], intra_bw: float) -> list[WorkerProfile]:
    """The workers' profiles with their region server as the other end of their link."""
    return [replace(p, region=Region(p.region.name, REGIONS["local"].latency,
                                     p.region.intra_bw or intra_bw,
                                     p.region.intra_bw or intra_bw)) for p in fleet]


class ServerTransfers:
    def __init__(self, cfg: Config, fleet: list[WorkerProfile], events, log: RunLog) -> None:
        self.links = [fleet[ws[0]].region for ws in by_region(fleet)]
        self.events, self.log = events, log
        self.amplitude, self.peak_hour = cfg.network.daily_amplitude, cfg.network.peak_hour
        self.flying: dict[int, dict] = {}  # key -> the transfers row so far

    def seconds(self, kind: str, region: int, nbytes: int, now: float) -> float:
        """A push (up) or the global model (down) over ``region``'s link to the server."""
        link = self.links[region]
        bw = link.up_bw if kind == "push" else link.down_bw
        factor = daily_factor(now, self.amplitude, self.peak_hour) if self.amplitude else 1.0
        return link.latency + nbytes / (bw * factor)

    def send(self, model: GlobalModel, now: float) -> None:
        """Start every transfer the strategy has queued."""
        for t in model.strategy.take_transfers():
            at = now + self.seconds(t.kind, t.region, t.nbytes, now)
            self.flying[t.key] = {"key": t.key, "kind": t.kind, "region": t.region,
                                  "bytes": t.nbytes, "t_sent": now, "t_arrived": at}
            self.events.deliver_at(at, t.key)

    def arrived(self, key: int, model: GlobalModel, now: float,
                new_version: Callable[[object], None]) -> None:
        """Transfer ``key`` is in: the strategy takes it (maybe a new global version)."""
        row = self.flying.pop(key)
        params, staleness = model.deliver(key)
        if params is not None:
            new_version(params)
        self.log.transferred({**row, "staleness": staleness, "version": model.version})
        self.send(model, now)

    def state_dict(self) -> dict:
        return {"flying": {k: dict(v) for k, v in self.flying.items()}}

    def load_state_dict(self, st: dict) -> None:
        self.flying = {k: dict(v) for k, v in st["flying"].items()}
