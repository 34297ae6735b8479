"""Decoupled DiLoCo's merge as a fedlm plug-in: a minimum quorum, a grace window, and a
merge that weights each update by its tokens times its tokens per step, averaged by
radial-directional averaging.

Source: the Decoupled DiLoCo team (Douillard, Rush, Donchev, Charles et al., Google
DeepMind), "Decoupled DiLoCo for Resilient Distributed Pre-training", arXiv 2604.21428,
2026. Learners train on their own; a syncer merges whatever has arrived once a minimum
quorum of learners has reported, waits an adaptive grace window for more, and weights
each contribution by "tokens processed times tokens-per-step efficiency" (the abstract);
outer SGD with Nesterov momentum. The paper's method section could not be read here; the
weight's formula and the radial-directional averaging (RDA) are as four secondary
statements of it agree (its Sec. 3.2 weight w = c_tokens · c_tokens / c_steps; RDA for
every tensor but the embeddings, which take the weighted mean).

The rule, for updates g_m (c_m tokens in s_m inner steps):

    pending P ← P + {m}; once P holds updates of q distinct workers (``outer.quorum``,
    0: half the workers, rounded up), merge P:
        a_m = c_m · (c_m / s_m)                            tokens × tokens per step
        per tensor (``outer.merge = "rda"``; "mean": the weighted mean everywhere):
            r = Σ a_m ‖g_m‖ / Σ a_m,   u = Σ a_m g_m/‖g_m‖ / Σ a_m,   Δ = r · u / ‖u‖
        the embeddings (``tok_emb``, ``pos_emb``): Δ = Σ a_m g_m / Σ a_m
        m ← β·m + Δ;   θ ← θ₀ − ε·(β·m + Δ)                  DiLoCo's outer Nesterov
    grace: an update that arrives before any worker has been handed new work joins the
    merge, which is made again over P ∪ {it} from the same θ₀ and m: one merge of all.

With the same tokens a step everywhere, a_m = b² · s_m (b tokens a step): a worker twice
as fast, which does twice the steps under DyLU, weighs twice as much, not four times (this
file once multiplied by the worker's speed too). ε = ``outer.lr`` (0.7), β =
``outer.momentum`` (0.9): the paper publishes none, these are DiLoCo's. The engine's grace
window stands for the syncer's: with ``grace = adaptive`` (or a number of seconds) the
engine takes the jobs expected to finish together before anyone restarts
(docs/async_local_sgd.md); ``auto`` opens it where jobs are meant to finish together.

fedlm's choices and simplifications: q = half the workers by default (the paper's K is
free, often 1); whole models, not fragments (the paper streams fragments); a merge's
workers restart from the merged model, where a decoupled learner would go on from its
own weights and receive fragments as they come (how it takes them in could not be read);
fedlm's grace window for the paper's slack-based one. A retired worker no longer counts
towards q. A quorum above the worker count is refused when the config loads.

    PYTHONPATH=examples fedlm run --set strategy=decoupled_diloco:DecoupledMerge \\
        --set model=tiny --set grace=adaptive --set outer.quorum=2
"""

from __future__ import annotations

from typing import Any

from fedlm.strategies import transforms as T
from fedlm.strategies.base import Strategy, Update, check_outer_sgd, momentum_text

SOURCE = ("reconstruction of Douillard et al. 2026 (arXiv 2604.21428) from its abstract and "
          "agreeing secondary statements: tokens x tokens-per-step weights, RDA, quorum, "
          "grace; fedlm's: the quorum default, whole models, workers restart from the merge")
EMBEDDINGS = ("tok_emb.", "pos_emb.")  # merged by the weighted mean, as the paper's


def radial_directional(grads: list, weights: list[float]) -> dict:
    """Per tensor: the weighted mean norm along the weighted mean direction (RDA); the
    embeddings, and a tensor whose directions cancel, by the weighted mean."""
    plain = T.weighted_mean(grads, weights)
    total = sum(weights)
    out = {}
    for name, mean in plain.items():
        norms = [float(g[name].norm()) for g in grads]
        if name.startswith(EMBEDDINGS) or min(norms) == 0.0:
            out[name] = mean
            continue
        radius = sum(a * r for a, r in zip(weights, norms)) / total
        direction = sum(a * g[name] / r for a, g, r in zip(weights, grads, norms)) / total
        size = float(direction.norm())
        out[name] = mean if size == 0.0 else direction * (radius / size)
    return type(plain)(out)


class DecoupledMerge(Strategy):
    """Decoupled DiLoCo's syncer: a quorum, a grace window, a tokens x tokens-per-step merge."""

    name = "decoupled-merge"
    source = SOURCE
    synchronous = False  # no barrier: a free worker always gets a job
    wants_grace = True  # grace = auto: the adaptive window where jobs finish together

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True,
                 quorum: int = 0, merge: str = "rda") -> None:
        check_outer_sgd(lr, momentum)
        if not (isinstance(quorum, int) and quorum >= 0):
            raise ValueError(f"outer.quorum: must be an int >= 0 (0: half the workers), "
                             f"got {quorum!r}")
        if merge not in ("rda", "mean"):
            raise ValueError(f"outer.merge: rda or mean, got {merge!r}")
        self.lr, self.momentum, self.nesterov, self.quorum = lr, momentum, nesterov, quorum
        self.merge = merge
        self.optimizer = T.sgd(lr, momentum, nesterov)

    def on_fleet(self, facts) -> None:
        # told by the config check too: refused before a run is stored
        workers = len(facts.step_times)
        if self.quorum > workers:  # capped without a word, it would be another method
            raise ValueError(f"outer.quorum: {self.quorum} is more than the {workers} "
                             f"workers")

    def start(self, params, *, num_workers: int) -> None:
        self.num_workers = num_workers
        self.opt_state = self.optimizer.init(params)
        self.pending: list[Update] = []  # waiting for the quorum
        self.open: dict[str, Any] | None = None  # the last merge, while it may still grow
        self.gone: list[int] = []  # retired workers
        self.merges = 0

    def needed(self) -> int:
        """q: distinct workers a merge waits for (never more than are left)."""
        q = self.quorum or -(-self.num_workers // 2)
        return max(1, min(q, self.num_workers - len(self.gone)))

    @staticmethod
    def weight(u: Update) -> float:
        """a_m = tokens × tokens per step (the paper's Sec. 3.2 weight)."""
        return u.tokens * (u.tokens / u.local_steps) if u.local_steps > 0 else 0.0

    def wants_job(self, worker: int, *, version: int) -> bool:
        return worker not in self.gone

    def on_dispatch(self, worker: int, *, version: int) -> None:
        self.open = None  # someone got new work: the grace window is over

    def on_update(self, update: Update, params):
        if self.open is not None:  # in the grace window: the merge takes it too
            return self._merge(self.open["theta"], self.open["opt_state"],
                               [*self.open["members"], update])
        self.pending.append(update)
        return self._maybe_merge(params)

    def on_job_lost(self, worker: int, *, job_id: int, reason: str, params):
        if reason == "retired":
            self.gone.append(worker)
            return self._maybe_merge(params)  # the quorum may be smaller now
        return None

    def _maybe_merge(self, params):
        if not self.pending or len({u.worker for u in self.pending}) < self.needed():
            return None
        members, self.pending = self.pending, []
        self.merges += 1
        return self._merge(params, self.opt_state, members)

    def _merge(self, theta, opt_state, members: list[Update]):
        """θ − outer Nesterov step on the members' merged outer gradient, from ``theta``
        and ``opt_state`` (the merge stays open until a worker is handed new work)."""
        grads, weights = [u.outer_grad for u in members], [self.weight(u) for u in members]
        if sum(weights) <= 0:  # only empty jobs: nothing to merge
            weights = [1.0] * len(members)
        mean = radial_directional(grads, weights) if self.merge == "rda" \
            else T.weighted_mean(grads, weights)
        step, self.opt_state = self.optimizer.update(mean, opt_state, None)
        self.open = {"theta": theta, "opt_state": opt_state, "members": members}
        return T.descend(theta, step)

    _STATE = ("num_workers", "opt_state", "pending", "open", "gone", "merges")

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in self._STATE:
            setattr(self, k, state[k])

    def summary(self) -> str:
        quorum = self.quorum or "half the workers"
        return (f"{self.name}: quorum {quorum}, grace window joins, tokens x tokens-per-step "
                f"{'RDA' if self.merge == 'rda' else 'mean'} merge, "
                f"outer lr {self.lr}{momentum_text(self.momentum, self.nesterov)}")
