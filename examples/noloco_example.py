"""NoLoCo as a fedlm plug-in: no global server, no all-reduce (Kolehmainen et al.,
"NoLoCo: No-all-reduce Low Communication Training Method for Large Models", 2025,
arXiv 2506.10911; the rule as their code applies it, ``SparseOptimizerC``).

Every worker i keeps its own slow model φ_i and outer momentum m_i. At its k-th
outer step it trains H inner steps from φ_i (outer gradient g_i = φ_i − θ_i) and
meets the other members of its group for round k: workers are shuffled by a
permutation seeded with k and paired in order (an odd one out joins the last
pair). Once every member of the group has reported round k, each member j takes

    m_j ← α·m_j − β·mean_G(g) − γ·(φ_j − mean_G(φ))
    φ_j ← φ_j + m_j

and starts its next job from φ_j. A worker waits only for its group, never for
the whole fleet. α = ``momentum`` (0.9), β = ``lr`` (0.7), γ = ``gamma`` (β by
default, as in their code). A lost job counts as g = 0 (the worker still meets its
group with its φ); a retired worker leaves every later group.

Who holds what: the server (``PeerServer``, the strategy's ``default_server``) keeps
the workers' slow models φ and hands them to the strategy, which returns them merged
(tensors in, tensors out); the strategy keeps the momenta and the rounds. What is
evaluated: the mean of the workers' slow models, mean_i(φ_i). NoLoCo never forms it
(each replica is a model of its own); it is the one model a fedlm run reports and
hashes, a new version each time a group merges. A round makes one version per group,
so ``updates`` counts rounds (``PeerServer.versions_per_update``).

Timing in fedlm: a job's download and upload go over its worker's own link, standing
for the exchange with its peer (the peer's link is not modelled).

    PYTHONPATH=examples fedlm run --set strategy=noloco_example:NoLoCo
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedlm.servers import Server, Serves
from fedlm.sim import fleet
from fedlm.strategies import transforms as T
from fedlm.strategies.base import Strategy, Update, check_outer_sgd


class PeerServer(Server):
    """No global server: each worker's slow model φ_i is its own, and its jobs start
    from it; the strategy is handed the φ (as the models it steps) and returns them
    merged, and the evaluated model is their mean."""

    serves = Serves(keeps_job_starts=True)  # φ_i moves on: each job keeps its own start

    def start_strategy(self, params, fleet: list) -> None:
        self.phi = [params] * len(fleet)  # tensors are never changed in place
        super().start_strategy(params, fleet)

    def start_of(self, worker: int):
        return self.phi[worker]

    def take(self, update):
        return self._merged(self.strategy.on_update(update, self.phi))

    def lose(self, worker: int, *, job_id: int, reason: str):
        return self._merged(self.strategy.on_job_lost(worker, job_id=job_id, reason=reason,
                                                      params=self.phi))

    def _merged(self, phi):
        """A group merged (``phi``: every worker's slow model now): the evaluated mean."""
        if phi is None:
            return None
        self.phi, count = phi, float(len(phi))
        return T.tree_map(lambda *p: sum(p) / count, *phi)  # evaluated: mean_i φ_i

    def state_dict(self) -> dict:
        return {**super().state_dict(), "phi": self.phi}

    def load_state_dict(self, state: dict, checkpoint: dict | None = None) -> None:
        super().load_state_dict(state, checkpoint)
        # older checkpoints kept the φ in the strategy's state
        self.phi = state["phi"] if "phi" in state else state["strategy"]["phi"]

    @property
    def versions_per_update(self) -> int:
        return max(1, fleet.node_count(self.cfg) // 2)  # a version per group merged


def groups(round_index: int, workers: list[int]) -> list[list[int]]:
    """Round ``round_index``'s groups of ``workers``: pairs of a seeded permutation."""
    order = [workers[i] for i in np.random.default_rng(round_index + 1).permutation(len(workers))]
    out = [order[i:i + 2] for i in range(0, len(order) - 1, 2)]
    if len(order) % 2:
        if out:
            out[-1].append(order[-1])
        else:
            out = [order]
    return out


SOURCE = ("follows Kolehmainen et al. 2025 (arXiv 2506.10911) as their code applies it "
          "(SparseOptimizerC); fedlm's: the pairing seed, gamma = lr by default")


class NoLoCo(Strategy):
    """NoLoCo: each worker merges with a random peer under a modified Nesterov step."""

    name = "noloco"
    source = SOURCE
    synchronous = False  # no barrier across the fleet: a worker waits for its group only
    default_server = "noloco_example:PeerServer"  # it hands on_update the φ, not a model

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9,
                 gamma: float | None = None) -> None:
        check_outer_sgd(lr, momentum)
        gamma = lr if gamma is None else gamma
        if gamma < 0:
            raise ValueError(f"outer.gamma: must be >= 0, got {gamma!r}")
        self.lr, self.momentum, self.gamma = lr, momentum, gamma

    def start(self, params, *, num_workers: int) -> None:
        self.num_workers = num_workers
        self.mom = [T.tree_map(lambda t: t * 0.0, params)] * num_workers
        self.round = [0] * num_workers  # outer steps each worker has merged
        self.reported: dict[int, Any] = {}  # worker -> its g for its current round
        self.gone: list[int] = []

    def wants_job(self, worker: int, *, version: int) -> bool:
        return worker not in self.reported and worker not in self.gone

    def _group(self, worker: int) -> list[int]:
        """``worker``'s group this round, less the retired (the partition itself does
        not change when a worker retires: the others may have merged in it already)."""
        group = next(g for g in groups(self.round[worker], list(range(self.num_workers)))
                     if worker in g)
        return [w for w in group if w not in self.gone]

    # ``params``: every worker's slow model φ (PeerServer's); a merge returns them anew
    def on_update(self, update: Update, params):
        self.reported[update.worker] = update.outer_grad
        return self._merge(update.worker, params)

    def on_job_lost(self, worker: int, *, job_id: int, reason: str, params):
        if reason == "retired":
            self.gone.append(worker)
            self.reported.pop(worker, None)
            for w in list(self.reported):  # a group that only lacked it merges now
                merged = self._merge(w, params)
                if merged is not None:
                    return merged
            return None
        self.reported[worker] = T.tree_map(lambda t: t * 0.0, params[worker])
        return self._merge(worker, params)

    def _merge(self, worker: int, phi: list):
        """Merge ``worker``'s group if every member has reported this round: the
        workers' slow models ``phi`` with the group's moved, else None."""
        group = self._group(worker)
        if any(w not in self.reported or self.round[w] != self.round[worker] for w in group):
            return None
        n, phi = float(len(group)), list(phi)
        mean_g = T.tree_map(lambda *g: sum(g) / n, *(self.reported[w] for w in group))
        mean_phi = T.tree_map(lambda *p: sum(p) / n, *(phi[w] for w in group))
        a, b, c = self.momentum, self.lr, self.gamma
        for w in group:
            self.mom[w] = T.tree_map(lambda m, g, p, mp: a * m - b * g - c * (p - mp),
                                     self.mom[w], mean_g, phi[w], mean_phi)
            phi[w] = T.tree_map(lambda p, m: p + m, phi[w], self.mom[w])
            self.round[w] += 1
            del self.reported[w]
        return phi

    _STATE = ("num_workers", "mom", "round", "reported", "gone")

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = {"num_workers": len(state.get("phi", ())), **state}  # older: φ kept here
        for k in self._STATE:
            setattr(self, k, state[k])

    def summary(self) -> str:
        return (f"noloco: peer groups of 2, outer lr {self.lr}, momentum {self.momentum}, "
                f"gamma {self.gamma}; evaluated: the workers' mean")
