"""Region servers: a server next to the workers of every region and a global one
(``server = "regions"``; HALoS, ``strategy = "halos"``, runs on it).

The kind owns every model and composes strategies, as the streamed server composes
one per fragment: each region's server holds its region's model θ_r and an instance
of the run's strategy, which takes the region's workers' updates on θ_r (a region
version each time it steps); the global server holds the evaluated (and hashed)
model θ_g and an instance of its own, made with the settings of ``server.global_outer``
in place of the run's ``[outer]`` ones (``RegionSettings``; HALoS suggests its own). Between them go
messages (``Message``), which the engine times over each region's link to the global
server (``fedlm.engine.transfers``) and hands back on arrival, as operations of the
run log:

    every K region versions since its last merge (K = server.push_every), region r
        sends Δ_r = θ̂_r − θ_r up ("push"; θ̂_r: θ_r right after that merge)
    the global server takes Δ_r as an update from r (a new evaluated version when its
        strategy steps) and sends θ_g back down ("model")
    region r merges it: θ_r ← (1 − α)·θ_r + α·θ_g;  θ̂_r ← θ_r   (α = server.merge)

A worker's job starts from its region's model and reports to its region's server over
the region's own link (``local_links``); nobody waits for the global server. Staleness
is counted per level: a worker update's in region versions since its dispatch; a push's
in global versions since its region last merged; a returning model's in region versions
since its region pushed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from fedlm.config import Config
from fedlm.errors import ConfigError
from fedlm.params import num_bytes
from fedlm.servers.protocol import Server, Serves
from fedlm.sim.fleet import REGIONS, Region, WorkerProfile, by_region
from fedlm.strategies.base import Strategy, Update
from fedlm.strategies.transforms import tree_map

def local_links(fleet: list[WorkerProfile], intra_bw: float) -> list[WorkerProfile]:
    """The workers' profiles with their region server as the other end of their link."""
    return [replace(p, region=Region(p.region.name, REGIONS["local"].latency,
                                     p.region.intra_bw or intra_bw,
                                     p.region.intra_bw or intra_bw)) for p in fleet]


@dataclass(frozen=True)
class RegionSettings:
    """The region servers' own settings (``[server]``): the defaults push after every
    region version and merge the global model whole; HALoS suggests its own
    (``strategies/halos.py``)."""

    merge: float = 1.0  # α: how much of the global model a region's server merges in
    push_every: int = 1  # K: region versions between a region's pushes
    # the global server's strategy settings in place of the run's [outer] ones (HALoS:
    # its global delayed Nesterov's lr, momentum, buffer_size and c); none: the same
    global_outer: dict[str, Any] = field(default_factory=dict)
    # where older configs gave them: in [outer], as HALoS's constructor took them
    OLD_NAMES: ClassVar[dict[str, str]] = {
        "merge": "merge", "push_every": "push_every", "global_lr": "global_outer.lr",
        "global_momentum": "global_outer.momentum", "global_c": "global_outer.c",
        "global_buffer_size": "global_outer.buffer_size"}

    def __post_init__(self) -> None:
        if not 0 < self.merge <= 1:
            raise ValueError(f"server.merge: must be in (0, 1], got {self.merge!r}")
        if self.push_every < 1:
            raise ValueError(f"server.push_every: must be >= 1, got {self.push_every!r}")


class RegionServers(Server):
    # each region's server steps on its own workers' arrivals (asynchronous strategies);
    # workers talk to their region's server, not over a shared link; a region's model
    # moves on, so a job's start is its own
    serves = Serves(synchronous=False, shared_link=False, keeps_job_starts=True)
    Settings = RegionSettings

    @classmethod
    def check(cls, cfg: Config, strategy: type[Strategy]) -> None:
        """The global server's strategy takes its settings (``global_outer``) too."""
        from fedlm.config_check import check_outer_types
        from fedlm.servers.settings import settings_of
        from fedlm.strategies.registry import check_strategy

        top = settings_of(cfg, cls).global_outer
        check_outer_types(strategy, top, "server.global_outer")
        try:
            check_strategy(cfg.strategy, {**cfg.outer, **top})
        except ValueError as exc:  # a ConfigError too: it names the [outer] key
            raise ConfigError(f"server.global_outer: the global server's {cfg.strategy}: "
                              f"{str(exc).splitlines()[0]}") from None

    def describe(self) -> str:
        s = self.settings
        top = ", ".join(f"{k} {v}" for k, v in s.global_outer.items()) or "as the regions'"
        return f"region servers: global {top}; merge {s.merge}, push every {s.push_every}"

    def worker_links(self, fleet: list) -> list:
        return local_links(fleet, self.cfg.network.intra_bw)

    def start_strategy(self, params, fleet: list) -> None:
        self.regions = by_region(fleet)
        self.region_of = {w: r for r, ws in enumerate(self.regions) for w in ws}
        n = len(self.regions)
        # the run's strategy at the first region's server, one like it at every other
        self.parts = [self.strategy] + [self.new_strategy() for _ in range(n - 1)]
        self.top = self.new_strategy({**self.cfg.outer, **self.settings.global_outer})
        for part, workers in zip(self.parts, self.regions):
            part.on_fleet(self.facts([fleet[w] for w in workers]))
            part.start(params, num_workers=len(workers))
        self.top.on_fleet(self.facts(fleet))
        self.top.start(params, num_workers=n)
        self.models = [params] * n  # θ_r (tensors are never changed in place)
        self.merged = [params] * n  # θ̂_r
        self.region_version = [0] * n  # versions of each region's model
        self.merged_version = [0] * n  # ... when it last merged (or started)
        self.global_version = 0  # versions of the global model (pushes it stepped on)
        self.global_seen = [0] * n  # the global version each region last merged
        self.work = [(0, 0)] * n  # tokens, inner steps of each region's updates since its push
        self.dispatched_at: dict[int, int] = {}  # worker -> its region's version then
        self.pending: dict[int, dict] = {}  # messages on their way, by key (see _send)

    # -- the region servers ----------------------------------------------------------
    def wants_job(self, worker: int, version: int) -> bool:
        r = self.region_of[worker]
        return self.parts[r].wants_job(worker, version=self.region_version[r])

    def dispatched(self, worker: int, version: int) -> None:
        r = self.region_of[worker]
        self.dispatched_at[worker] = self.region_version[r]
        self.parts[r].on_dispatch(worker, version=self.region_version[r])

    def start_of(self, worker: int):
        return self.models[self.region_of[worker]]

    def staleness(self, worker: int, base_version: int) -> int:
        r = self.region_of[worker]
        return self.region_version[r] - self.dispatched_at.get(worker, self.region_version[r])

    def take(self, update: Update):
        r = self.region_of[update.worker]
        tokens, steps = self.work[r]
        self.work[r] = (tokens + update.tokens, steps + update.local_steps)
        self._region_step(r, self.parts[r].on_update(update, self.models[r]))
        return None  # the global model is unchanged: held until a push is merged

    def lose(self, worker: int, *, job_id: int, reason: str):
        r = self.region_of[worker]
        self._region_step(r, self.parts[r].on_job_lost(worker, job_id=job_id, reason=reason,
                                                       params=self.models[r]))
        return None

    def _region_step(self, r: int, new) -> None:
        """Region ``r``'s strategy stepped to ``new`` (None: it did not); every K
        region versions since its last merge, it pushes."""
        if new is None:
            return
        self.models[r] = new
        self.region_version[r] += 1
        if self.region_version[r] - self.merged_version[r] == self.settings.push_every:
            delta = tree_map(lambda a, b: a - b, self.merged[r], self.models[r])
            self._send(r, None, "push", delta)
            self.work[r] = (0, 0)

    # -- messages --------------------------------------------------------------------
    def _send(self, source: int | None, destination: int | None, kind: str, tensors,
              region_version: int | None = None) -> None:
        """Queue a message; a push carries its region's version and work, a global
        model the version of the push it answers (for the staleness on arrival)."""
        r = source if source is not None else destination
        tokens, steps = self.work[r] if source is not None else (0, 0)
        key = self.queue(source, destination, num_bytes(tensors), kind)
        self.pending[key] = {"source": source, "destination": destination, "tensors": tensors,
                             "region_version": (self.region_version[r] if region_version is None
                                                else region_version),
                             "global_version": self.global_version, "tokens": tokens,
                             "steps": steps}

    def deliver(self, key: int) -> tuple[Any | None, int]:
        """Message ``key`` arrived: a push at the global server (maybe a new global
        version), or the global model at a region's server (merged in)."""
        sent = self.pending.pop(key)
        if sent["destination"] is None:
            return self._at_global(key, sent)
        r = sent["destination"]
        a = self.settings.merge
        self.models[r] = tree_map(lambda mine, glob: (1.0 - a) * mine + a * glob,
                                  self.models[r], sent["tensors"])
        self.merged[r] = self.models[r]
        self.merged_version[r] = self.region_version[r]
        self.global_seen[r] = sent["global_version"]
        return None, self.region_version[r] - sent["region_version"]

    def _at_global(self, key: int, sent: dict) -> tuple[Any | None, int]:
        """A push is in: an update of the global server's strategy; θ_g goes back."""
        r = sent["source"]
        staleness = self.global_version - self.global_seen[r]
        update = Update(worker=r, job_id=key, base_version=self.global_seen[r],
                        outer_grad=sent["tensors"], tokens=sent["tokens"],
                        local_steps=sent["steps"], staleness=staleness)
        new = self.top.on_update(update, self.params)
        if new is not None:
            self.global_version += 1
        self._send(None, r, "model", self.params if new is None else new,
                   sent["region_version"])
        return new, staleness

    # -- state -----------------------------------------------------------------------
    state_fields = ("regions", "models", "merged", "region_version", "merged_version",
                    "global_version", "global_seen", "work", "dispatched_at", "pending")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "parts": [p.state_dict() for p in self.parts],
                "global": self.top.state_dict()}

    def load_state_dict(self, state: dict, checkpoint: dict | None = None) -> None:
        if "parts" not in state:
            state = _from_strategy(state)
        super().load_state_dict(state, checkpoint)
        for part, st in zip(self.parts, state["parts"]):
            part.load_state_dict(st)
        self.top.load_state_dict(state["global"])
        self.region_of = {w: r for r, ws in enumerate(self.regions) for w in ws}


def _from_strategy(state: dict) -> dict:
    """A checkpoint of an older fedlm kept the regions' models and both levels'
    optimizer states in the strategy's state (``halos``): the same, in today's places."""
    old = state["strategy"]
    n = len(old["regions"])
    parts = [{"opt_state": old["region_opt"][r], "num_workers": len(old["regions"][r]),
              "applied": old["region_version"][r]} for r in range(n)]
    pending = {k: {"source": m["region"] if m["kind"] == "push" else None,
                   "destination": None if m["kind"] == "push" else m["region"],
                   "tensors": m["tensors"], "region_version": m["region_version"],
                   "global_version": m["global_version"], "tokens": 0, "steps": 0}
               for k, m in old["pending"].items()}
    kept = ("regions", "models", "merged", "region_version", "merged_version", "global_version",
            "global_seen", "dispatched_at", "next_key")
    return {**state, "strategy": parts[0], "parts": parts, "pending": pending, "outbox": [],
            "work": [(0, 0)] * n, **{k: old[k] for k in kept},
            "global": {"opt_state": old["global_opt"], "num_workers": n,
                       "applied": old["global_version"]}}
