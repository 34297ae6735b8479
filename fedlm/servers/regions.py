"""Region servers: a server next to the workers of every region and a global one
(HALoS, ``fedlm.strategies.halos``).

A worker's job starts from its region's model and reports to its region's server
over the region's own link; the region servers and the global server exchange
``Transfer``s, which the engine times over each region's link to the global
server (``fedlm.engine.transfers``) and hands back on arrival, as operations of
the run log. The evaluated (and hashed) model is the global server's.

A strategy served here implements, beside ``Strategy``'s calls:

    place(regions)                 the workers of each region, before ``start``
    start_params(w, params)        the model a job of w starts from (its region's)
    staleness(w, base_version, v)  an arriving update's staleness
    take_transfers()               Transfers queued since the last call
    on_transfer(key, params)  ->   (new global params or None, its staleness)
"""

from __future__ import annotations

from dataclasses import replace

from fedlm.servers.protocol import Server
from fedlm.sim.fleet import REGIONS, Region, WorkerProfile, by_region


def local_links(fleet: list[WorkerProfile], intra_bw: float) -> list[WorkerProfile]:
    """The workers' profiles with their region server as the other end of their link."""
    return [replace(p, region=Region(p.region.name, REGIONS["local"].latency,
                                     p.region.intra_bw or intra_bw,
                                     p.region.intra_bw or intra_bw)) for p in fleet]


class RegionServers(Server):
    keeps_job_starts = True  # a region's model moves on: a job's start is its own
    shared_link = False  # workers talk to their region's server, not a shared one

    def worker_links(self, fleet: list) -> list:
        return local_links(fleet, self.cfg.network.intra_bw)

    def start_strategy(self, params, fleet: list) -> None:
        self.strategy.place(by_region(fleet))
        super().start_strategy(params, fleet)

    def start_of(self, worker: int):
        return self.strategy.start_params(worker, self.params)

    def staleness(self, worker: int, base_version: int) -> int:
        return self.strategy.staleness(worker, base_version, self.version)

    def take_transfers(self) -> list:
        return self.strategy.take_transfers()

    def deliver(self, key: int) -> tuple:
        return self.strategy.on_transfer(key, self.params)
