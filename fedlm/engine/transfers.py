"""Messages between servers (``Server.take_transfers``: for example between a server
in each region and a global one, ``fedlm.servers.regions``): how long each takes,
and what happens when one arrives.

Each region of the fleet may have a server next to its workers; the global server
sits where the star topology's server does. A transfer names the region at its
other end, and travels over that region's link to the server: its latency,
``up_bw`` to the global server (``kind`` "push"), ``down_bw`` from it (any other
kind), scaled by the daily cycle.

``ServerTransfers.send`` starts the transfers the server has queued, each on the
event clock (virtual, or the wall clock's simulated link time); ``arrived`` hands
one back to the server, makes a version if the evaluated model changed, and logs
the arrival as an operation: replay walks it in that order. A server that sends
none costs nothing here.
"""

from __future__ import annotations

from typing import Callable

from fedlm.config import Config
from fedlm.servers import Server
from fedlm.sim.fleet import WorkerProfile, by_region
from fedlm.sim.links import transfer_seconds
from fedlm.sim.network import daily_factor

from fedlm.engine.runlog import RunLog


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
        return transfer_seconds(nbytes, bw * factor, link.latency)

    def send(self, model: Server, now: float) -> None:
        """Start every transfer the server has queued."""
        for t in model.take_transfers():
            at = now + self.seconds(t.kind, t.region, t.nbytes, now)
            self.flying[t.key] = {"key": t.key, "kind": t.kind, "region": t.region,
                                  "bytes": t.nbytes, "t_sent": now, "t_arrived": at}
            self.events.deliver_at(at, t.key)

    def arrived(self, key: int, model: Server, now: float,
                new_version: Callable[[object], None]) -> None:
        """Transfer ``key`` is in: the server takes it (maybe a new version)."""
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
