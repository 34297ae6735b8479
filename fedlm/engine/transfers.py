"""Messages between servers (``fedlm.servers.Message``): how long each takes, and its
arrival in the run log.

A server is named by the index of a region of the fleet (or None: the fleet's own
server, where the star topology's sits). A message goes up its source's link to the
fleet's server and down its destination's: each leg the link's latency plus its
bytes over ``up_bw`` (up) or ``down_bw`` (down), scaled by the daily cycle. So a
message to or from the fleet's server crosses one link, one between two others two.

``ServerTransfers.send`` starts the messages a server has queued, each on the event
clock (virtual, or the wall clock's simulated link time); ``arrived`` logs one as an
operation once the server has taken it (``ServerCalls.arrived``): replay walks it in
that order. A server that sends none costs nothing here.
"""

from __future__ import annotations

from fedlm.config import Config
from fedlm.servers import Message
from fedlm.sim.fleet import WorkerProfile, by_region
from fedlm.sim.links import transfer_seconds
from fedlm.sim.network import daily_factor

from fedlm.engine.runlog import RunLog


class ServerTransfers:
    def __init__(self, cfg: Config, fleet: list[WorkerProfile], events, log: RunLog) -> None:
        self.links = [fleet[ws[0]].region for ws in by_region(fleet)]
        self.events = events
        self.log = log
        self.amplitude, self.peak_hour = cfg.network.daily_amplitude, cfg.network.peak_hour
        self.flying: dict[int, dict] = {}  # key -> the transfers row so far

    def seconds(self, message: Message, now: float) -> float:
        """Up the source's link (if a region's), then down the destination's; or the
        seconds its sender gave it (``Message.seconds``)."""
        if message.seconds is not None:
            return message.seconds
        factor = daily_factor(now, self.amplitude, self.peak_hour) if self.amplitude else 1.0
        legs = [(self.links[r], "up") for r in [message.source] if r is not None]
        legs += [(self.links[r], "down") for r in [message.destination] if r is not None]
        return sum(transfer_seconds(message.nbytes, (link.up_bw if way == "up" else link.down_bw)
                                    * factor, link.latency) for link, way in legs)

    def send(self, messages: list[Message], now: float) -> None:
        """Start ``messages`` now."""
        for m in messages:
            at = now + self.seconds(m, now)
            # the log's region: the link it crosses to or from the fleet's server (-1:
            # neither end is a region's, a timer the fleet's server sets itself)
            region = m.source if m.source is not None else m.destination
            region = -1 if region is None else region
            self.flying[m.key] = {"key": m.key, "kind": m.kind, "region": region,
                                  "bytes": m.nbytes, "t_sent": now, "t_arrived": at}
            self.events.deliver_at(at, m.key)

    def arrived(self, key: int, staleness: int, version: int) -> None:
        """Message ``key`` is in, and taken by its server (``version``: the evaluated
        model's version after it)."""
        row = self.flying.pop(key)
        self.log.transferred({**row, "staleness": staleness, "version": version})

    def state_dict(self) -> dict:
        return {"flying": {k: dict(v) for k, v in self.flying.items()}}

    def load_state_dict(self, st: dict) -> None:
        self.flying = {k: dict(v) for k, v in st["flying"].items()}
