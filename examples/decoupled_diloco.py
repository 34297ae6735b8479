"""Decoupled DiLoCo's merge as a fedlm plug-in: a minimum quorum, a grace window, and
a merge that weights each update by the tokens it trained and its worker's speed.

Source: the Decoupled DiLoCo team (Douillard, Rush, Donchev, Charles et al., Google
DeepMind), "Decoupled DiLoCo for Resilient Distributed Pre-training", arXiv 2604.21428,
2026. Learners train on their own; a syncer merges whatever has arrived once a minimum
quorum of learners has reported, waits an adaptive grace window for more, and weights
each contribution by "tokens processed times tokens-per-step efficiency"; outer SGD
with Nesterov momentum. The weight's exact formula was not in what could be read of
the paper here (its abstract and a summary); this file implements the rule the issue
states, "a merge weighted by tokens and speed". In fedlm every step of a worker trains
the same number of tokens, so tokens per step alone cannot tell workers apart; the
speed that does is tokens per second of compute, tokens per step over the worker's
seconds per step (its profile, which ``SpeedServer`` hands the strategy).

The rule, for updates g_m (worker w_m, c_m tokens in s_m inner steps):

    pending P ← P + {m}; once P holds updates of q distinct workers (``outer.quorum``,
    0: half the workers, rounded up), merge P:
        a_m = c_m · (c_m / s_m) / step_time(w_m)          tokens × tokens per second
        Δ   = Σ_P a_m g_m / Σ_P a_m                          (in arrival order)
        m ← β·m + Δ;   θ ← θ₀ − ε·(β·m + Δ)                  DiLoCo's outer Nesterov
    grace: an update that arrives before any worker has been handed new work joins the
    merge, which is made again over P ∪ {it} from the same θ₀ and m: one merge of all.

ε = ``outer.lr`` (0.7), β = ``outer.momentum`` (0.9). The engine's grace window is the
syncer's: with ``grace = adaptive`` (or a number of seconds) the engine takes the jobs
expected to finish together before anyone restarts (docs/async_local_sgd.md), and every
one of them joins the merge; ``auto`` opens it where jobs are meant to finish together
(DyLU or equal speeds).

Simplified: whole models, not fragments (the paper streams fragments); a merge's
workers restart from the merged model, where a decoupled learner would go on from its
own weights; the speed is the profile's nominal one, not measured; fedlm's grace window
stands for the paper's adaptive one. A retired worker no longer counts towards q.

    PYTHONPATH=examples fedlm run --set strategy=decoupled_diloco:DecoupledMerge \\
        --set model=tiny --set grace=adaptive --set outer.quorum=2
"""

from __future__ import annotations

from typing import Any

from fedlm.servers import Server
from fedlm.strategies import transforms as T
from fedlm.strategies.base import Strategy, Update, check_outer_sgd, momentum_text


class SpeedServer(Server):
    """One server that tells the strategy each worker's speed (inner steps a second,
    from the fleet's profiles) before it starts."""

    def start_strategy(self, params, fleet: list) -> None:
        self.strategy.set_speeds([1.0 / p.step_time for p in fleet])
        super().start_strategy(params, fleet)


class DecoupledMerge(Strategy):
    """Decoupled DiLoCo's syncer: a quorum, a grace window, a tokens × speed merge."""

    name = "decoupled-merge"
    synchronous = False  # no barrier: a free worker always gets a job
    wants_grace = True  # grace = auto: the adaptive window where jobs finish together
    default_server = "decoupled_diloco:SpeedServer"

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True,
                 quorum: int = 0) -> None:
        check_outer_sgd(lr, momentum)
        if not (isinstance(quorum, int) and quorum >= 0):
            raise ValueError(f"outer.quorum: must be an int >= 0 (0: half the workers), "
                             f"got {quorum!r}")
        self.lr, self.momentum, self.nesterov, self.quorum = lr, momentum, nesterov, quorum
        self.optimizer = T.sgd(lr, momentum, nesterov)
        self.speeds: list[float] | None = None

    def set_speeds(self, speeds: list[float]) -> None:
        self.speeds = list(speeds)

    def start(self, params, *, num_workers: int) -> None:
        self.speeds = self.speeds or [1.0] * num_workers  # no SpeedServer: alike
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

    def weight(self, u: Update) -> float:
        """a_m = tokens × tokens per second of its worker."""
        return u.tokens * (u.tokens / max(1, u.local_steps)) * self.speeds[u.worker]

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
        """θ − outer Nesterov step on the members' tokens × speed mean, from ``theta``
        and ``opt_state`` (the merge stays open until a worker is handed new work)."""
        mean = T.weighted_mean([u.outer_grad for u in members], [self.weight(u) for u in members])
        step, self.opt_state = self.optimizer.update(mean, opt_state, None)
        self.open = {"theta": theta, "opt_state": opt_state, "members": members}
        return T.descend(theta, step)

    _STATE = ("speeds", "num_workers", "opt_state", "pending", "open", "gone", "merges")

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in self._STATE:
            setattr(self, k, state[k])

    def summary(self) -> str:
        quorum = self.quorum or "half the workers"
        return (f"{self.name}: quorum {quorum}, grace window joins, tokens x speed merge, "
                f"outer lr {self.lr}{momentum_text(self.momentum, self.nesterov)}")
