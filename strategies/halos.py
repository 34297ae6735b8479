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

In fedlm this is a composition (``server = "regions"``, ``fedlm.servers.regions``,
the default for this strategy): the region servers own every region's model, the
global server the evaluated (and hashed) θ_g, and each steps its model with an
instance of this strategy, which is delayed Nesterov and nothing else; the global
server's instance is made with the ``server.global_outer`` settings. Each push and each global
model on its way is a message between servers, timed by the engine and handed back
on arrival as an operation of the run log, so replay and resume are exact. Only a
push merged at the global server makes a global version (the evaluated model
changes); a worker update is held until then, so ``updates`` and ``eval.every``
count what they count for every strategy: changes of the evaluated model.

Settings, with HALoS's names (their run_halos.sh for Pythia-70M, 4 x 4); the region
servers' are ``[server]``'s (``fedlm.servers.regions.RegionSettings``), HALoS's values
suggested by ``default_server``:

    outer.lr, momentum, buffer_size   region DN: HALoS LLR·N, β = 0.9, N = 16 (lr 3.2)
    server.global_outer               global DN: HALoS GLR·N, β = 0.5, N = 2 (lr 0.3),
                                      c = 0 (older configs: outer.global_lr, ...)
    server.merge                      α = 0.25 (HALoS's model_merge_weight)
    server.push_every                 K = 2 (local_updates_accumulation; HALoS: 32)

K is the one default that is not HALoS's: their K = 32 is for runs of about 3,000
region updates per region, and a run of a few hundred (fedlm's scale) would push a
handful of times, or never (the global model, which is evaluated, would not move).
K = 2 was chosen at fedlm's scale on a tuning seed (experiments/archive/results/
halos_tuning.md); set ``server.push_every = 32`` for HALoS's published setting.

The global server sits where the fleet's server is (HALoS: in the first region);
each region's server is reached over the region's link to it (``fleet.matrix``).

Learning rates: HALoS's scripts pass lr = (their LR) × N to an optimizer that
divides each gradient by N, which is what fedlm's delayed Nesterov does with
``outer.lr``: so ``outer.lr`` = HALoS's LR × N (0.2 × 16 = 3.2), and each arrival
moves the region model by 0.2·g before momentum.
"""

from __future__ import annotations

from typing import ClassVar

from fedlm.strategies import transforms as T
from fedlm.strategies.base import check_outer_sgd
from fedlm.strategies.delayed_nesterov import DelayedNesterov


class Halos(DelayedNesterov):
    """HALoS: region servers (delayed Nesterov) and an async global server that merges them."""

    source = ("reconstruction of Kim et al. 2025 (ICML, utnslab/halos): their region and "
              "global DN constants, merge 0.25; chosen here: K = 2 pushes (theirs 32, for "
              "100x longer runs), outer lr = their LR x N")

    name = "halos"
    wants_grace = False  # HALoS has no grace window (delayed Nesterov alone asks for one)
    # its servers: one in every region and a global one (fedlm.servers.regions), with
    # HALoS's constants as their settings ([server] overrides each; so did outer.merge,
    # outer.push_every and outer.global_* in older configs)
    default_server: ClassVar[dict] = {
        "kind": "regions", "merge": 0.25, "push_every": 2,
        "global_outer": {"lr": 0.3, "momentum": 0.5, "buffer_size": 2, "c": 0.0}}

    def __init__(self, *, lr: float = 3.2, momentum: float = 0.9, buffer_size: int = 16,
                 c: float = 0.0) -> None:
        check_outer_sgd(lr, momentum)
        T.delayed_nesterov(momentum, buffer_size, c)  # c in [0, 1/N]: checked as it loads
        super().__init__(lr=lr, momentum=momentum, buffer_size=buffer_size, c=c)

    def summary(self) -> str:
        return (f"{self.name}: region DN lr {self.lr}, momentum {self.momentum}, N "
                f"{self.buffer_size}")
