"""HALoS: hierarchical asynchronous Local-SGD across regions.

Kim et al., "HALoS: Hierarchical Asynchronous Local SGD over Slow Networks for
Geo-Distributed Large Language Model Training", ICML 2025 (code: utnslab/halos).

Each region of the fleet has a *region server* (HALoS's local parameter server,
LPS) next to its workers, and one *global server* (GPS) sits in one region:

    worker w of region r finishes a job (outer gradient g, over the fast
        intra-region link):
        θ_r ← θ_r − DN_r(g)                         delayed Nesterov, fedlm's chain
        every K region updates since its last merge: push Δ_r = θ̂_r − θ_r to the
            global server (θ̂_r: θ_r just after that merge), over the slow link
        w starts its next job from θ_r at once (never waits for the global server)
    the global server receives Δ_r:
        θ_g ← θ_g − DN_g(Δ_r)                        its own delayed Nesterov
        sends θ_g back to region r
    region r receives θ_g:
        θ_r ← (1 − α)·θ_r + α·θ_g;  θ̂_r ← θ_r        the model merge

Nobody blocks: a region's workers keep training while its push and the global
model travel. The evaluated (and hashed) model is the global server's θ_g.

In fedlm's engine (through ``fedlm.servers.regions``): the strategy keeps every
region's model and both levels' optimizer states; the server asks it where each
job starts (``start_params``), the engine times the server-to-server transfers it
asks for (``take_transfers``) over the network model, and each one is handed back
when it arrives (``on_transfer``): a delivery is an operation of the run log, so
replay and resume are exact. Only a push merged at the global server makes a global
version (the evaluated model changes); a worker update is held until then, so
``updates`` and ``eval.every`` count what they count for every strategy: changes of
the evaluated model. Staleness is counted per level: a worker update's in region
versions, a push's in global versions.

Settings, with HALoS's names (their run_halos.sh for Pythia-70M, 4 x 4):

    lr, momentum, buffer_size  region DN: HALoS LLR·N, β = 0.9, N = 16 (lr 3.2)
    global_lr, global_momentum, global_buffer_size
                               global DN: HALoS GLR·N, β = 0.5, N = 2 (lr 0.3)
    merge                      α = 0.25 (HALoS's model_merge_weight)
    push_every                 K = 2 (local_updates_accumulation; HALoS: 32)

K is the one default that is not HALoS's: their K = 32 is for runs of about 3,000
region updates per region, and a run of a few hundred (fedlm's scale) would push a
handful of times, or never (the global model, which is evaluated, would not move).
K = 2 was chosen at fedlm's scale on a tuning seed (experiments/results/
halos_tuning.md); set ``outer.push_every = 32`` for HALoS's published setting.

The global server sits where the fleet's server is (HALoS: in the first region);
each region's server is reached over the region's link to it (``fleet.matrix``).

Learning rates: HALoS's scripts pass lr = (their LR) × N to an optimizer that
divides each gradient by N, which is what fedlm's delayed Nesterov does with
``outer.lr``: so ``outer.lr`` = HALoS's LR × N (0.2 × 16 = 3.2), and each arrival
moves the region model by 0.2·g before momentum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedlm.strategies import transforms as T
from fedlm.strategies.base import Strategy, Update, check_outer_sgd


@dataclass(frozen=True)
class Transfer:
    """A server-to-server message the engine times and hands back on arrival."""

    key: int  # the strategy's number for it
    kind: str  # "push" (region -> global) | "model" (global -> region)
    region: int  # the region server at the other end from the global server
    nbytes: int  # what travels (fp32 tensors)


class Halos(Strategy):
    """HALoS: region servers (delayed Nesterov) and an async global server that merges them."""

    name = "halos"
    synchronous = False
    server = "fedlm.servers.regions:RegionServers"  # it calls place ... on_transfer below

    def __init__(self, *, lr: float = 3.2, momentum: float = 0.9, buffer_size: int = 16,
                 c: float = 0.0, global_lr: float = 0.3, global_momentum: float = 0.5,
                 global_buffer_size: int = 2, merge: float = 0.25, push_every: int = 2) -> None:
        check_outer_sgd(lr, momentum)
        if global_lr <= 0:
            raise ValueError(f"outer.global_lr: must be > 0, got {global_lr!r}")
        if not 0 <= global_momentum < 1:
            raise ValueError(f"outer.global_momentum: must be in [0, 1), got {global_momentum!r}")
        if not 0 < merge <= 1:
            raise ValueError(f"outer.merge: must be in (0, 1], got {merge!r}")
        for key, value in (("buffer_size", buffer_size), ("global_buffer_size",
                                                          global_buffer_size),
                           ("push_every", push_every)):
            if value < 1:
                raise ValueError(f"outer.{key}: must be >= 1, got {value!r}")
        self.lr, self.momentum, self.buffer_size, self.c = lr, momentum, buffer_size, c
        self.global_lr, self.global_momentum = global_lr, global_momentum
        self.global_buffer_size, self.merge = global_buffer_size, merge
        self.push_every = push_every
        self.region_chain = T.chain(T.delayed_nesterov(momentum, buffer_size, c), T.scale(lr))
        self.global_chain = T.chain(T.delayed_nesterov(global_momentum, global_buffer_size),
                                    T.scale(global_lr))
        self.regions: list[list[int]] = []
        self.region_of: dict[int, int] = {}

    # -- setup ---------------------------------------------------------------------
    def place(self, regions: list[list[int]]) -> None:
        self.regions = [list(r) for r in regions]
        self.region_of = {w: r for r, ws in enumerate(regions) for w in ws}

    def start(self, params, *, num_workers: int) -> None:
        if not self.regions:  # not placed: one region of every worker
            self.place([list(range(num_workers))])
        n = len(self.regions)
        self.models = [params] * n  # θ_r (tensors are never changed in place)
        self.merged = [params] * n  # θ̂_r
        self.region_opt = [self.region_chain.init(params) for _ in range(n)]
        self.global_opt = self.global_chain.init(params)
        self.region_version = [0] * n  # updates applied at each region server
        self.merged_version = [0] * n  # ... when it last merged (or started)
        self.global_version = 0  # pushes applied at the global server
        self.global_seen = [0] * n  # the global version each region last merged
        self.dispatched_at: dict[int, int] = {}  # worker -> its region's version then
        self.pending: dict[int, dict] = {}  # transfers in flight, by key (see _send)
        self.outbox: list[Transfer] = []
        self.next_key = 0
        self.pushes = [0] * n

    # -- the worker level ----------------------------------------------------------
    def wants_job(self, worker: int, *, version: int) -> bool:
        return True

    def start_params(self, worker: int, params):
        return self.models[self.region_of[worker]]

    def on_dispatch(self, worker: int, *, version: int) -> None:
        self.dispatched_at[worker] = self.region_version[self.region_of[worker]]

    def staleness(self, worker: int, base_version: int, version: int) -> int:
        r = self.region_of[worker]
        return self.region_version[r] - self.dispatched_at.get(worker, self.region_version[r])

    def on_update(self, update: Update, params):
        r = self.region_of[update.worker]
        step, self.region_opt[r] = self.region_chain.update(update.outer_grad,
                                                            self.region_opt[r], update)
        self.models[r] = T.descend(self.models[r], step)
        self.region_version[r] += 1
        if self.region_version[r] - self.merged_version[r] == self.push_every:
            delta = T.tree_map(lambda a, b: a - b, self.merged[r], self.models[r])
            self._send("push", r, delta, self.region_version[r])
        return None  # the global model is unchanged: held until a push is merged

    # -- the global level ----------------------------------------------------------
    def _send(self, kind: str, region: int, tensors, region_version: int) -> None:
        """Queue a transfer; ``region_version``: the region's version when it pushed
        (a global model's transfer carries its push's, for the staleness on arrival)."""
        key, self.next_key = self.next_key, self.next_key + 1
        self.pending[key] = {"kind": kind, "region": region, "tensors": tensors,
                             "region_version": region_version,
                             "global_version": self.global_version}
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        self.outbox.append(Transfer(key, kind, region, nbytes))

    def take_transfers(self) -> list[Transfer]:
        """Transfers to start now (the engine times them); each comes back through
        ``on_transfer`` when it arrives."""
        out, self.outbox = self.outbox, []
        return out

    def on_transfer(self, key: int, params) -> tuple[Any | None, int]:
        """Transfer ``key`` arrived. Returns (new global params or None, its staleness:
        a push's in global versions since its region last merged, a global model's in
        region versions since its region pushed)."""
        sent = self.pending.pop(key)
        r = sent["region"]
        if sent["kind"] == "push":
            staleness = self.global_version - self.global_seen[r]
            step, self.global_opt = self.global_chain.update(sent["tensors"], self.global_opt,
                                                             None)
            params = T.descend(params, step)
            self.global_version += 1
            self.pushes[r] += 1
            self._send("model", r, params, sent["region_version"])
            return params, staleness
        a = self.merge  # the global model is back at region r: merge it in
        self.models[r] = T.tree_map(lambda mine, glob: (1.0 - a) * mine + a * glob,
                                    self.models[r], sent["tensors"])
        self.merged[r] = self.models[r]
        self.merged_version[r] = self.region_version[r]
        self.global_seen[r] = sent["global_version"]
        return None, self.region_version[r] - sent["region_version"]

    # -- state -----------------------------------------------------------------------
    _STATE = ("models", "merged", "region_opt", "global_opt", "region_version",
              "merged_version", "global_version", "global_seen", "dispatched_at", "pending",
              "next_key", "pushes", "regions", "outbox")

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.place(state["regions"])
        for k in self._STATE:
            setattr(self, k, state[k])

    def summary(self) -> str:
        return (f"{self.name}: {len(self.regions) or '?'} regions; region DN lr {self.lr}, "
                f"momentum {self.momentum}, N {self.buffer_size}; global DN lr "
                f"{self.global_lr}, momentum {self.global_momentum}, N "
                f"{self.global_buffer_size}; merge {self.merge}, push every {self.push_every}")
