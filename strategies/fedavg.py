"""Synchronous FedAvg / Local-SGD with a pluggable outer optimizer.

McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017, https://arxiv.org/abs/1602.05629

Each round every worker starts from the same global model; when the last one
has reported (the barrier), the round's outer gradients are averaged —
weighted by tokens, in worker order so the float sums are reproducible — and
the outer optimizer takes one step. With SGD at lr 1.0 the new model is exactly
the average of the workers' models.

Lost jobs: a worker whose job failed (error reply, rejected update) is asked
again in the same round. One that missed the round's deadline or was retired
is dropped from the round; when no job of the round is outstanding any more,
the round closes with the replies that arrived — if there are at least
``min_replies`` of them. Otherwise the round starts over from the same model.

Streaming DiLoCo (``stream.fragments``, ``stream.overlap``, ``stream.mix``) is not
this class's business: its server (``fedlm.servers.streamed``) gives each fragment
an instance of the strategy of its own, which sees only that fragment's tensors
(optax's ``multi_transform``, by fragment).
"""

from __future__ import annotations

from typing import Any

from fedlm.strategies import transforms as T
from fedlm.strategies.base import DROPPED, FleetFacts, Strategy, Update, check_outer_sgd, momentum_text
from fedlm.strategies.sampling import Sampling

WEIGHTINGS = ("tokens", "uniform", "fednova")  # how a round's outer gradients are merged


class FedAvg(Strategy):
    """Synchronous rounds; outer SGD (optionally with Nesterov momentum).

    Parameters
    ----------
    lr : float
        Outer learning rate ε. 1.0 is plain model averaging.
    momentum : float
        Outer momentum β; 0 disables it.
    nesterov : bool
        Nesterov momentum (as in DiLoCo) rather than heavy ball.
    weighting : {"tokens", "uniform", "fednova"}
        How the round's outer gradients are averaged: by the tokens each trained, each
        alike, or FedNova's normalisation by local steps (``transforms.normalized_mean``:
        for rounds whose jobs ran different numbers of steps).
    min_replies : int
        Fewest replies a round may close with after workers dropped out of it.
    fraction, min_workers, sample_by, overcommit, late
        Client sampling (``fedlm.strategies.sampling``): a round takes
        max(min_workers, floor(fraction · N)) of the N workers available, drawn
        uniformly or by data, dispatching ``overcommit`` times as many and keeping the
        first to report; the others' replies are dropped, or with ``late = "next"``
        merged into the next round. The defaults (1, 1, uniform, 1, drop): every worker,
        every round.
    """

    source = ("follows McMahan et al. 2017 (FedAvg: outer SGD, lr 1 = the average), "
              "Nesterov outer momentum as an option")

    name = "fedavg"
    synchronous = True

    def __init__(self, *, lr: float = 1.0, momentum: float = 0.0, nesterov: bool = False,
                 weighting: str = "tokens", min_replies: int = 1, fraction: float = 1.0,
                 min_workers: int = 1, sample_by: str = "uniform",
                 overcommit: float = 1.0, late: str = "drop") -> None:
        check_outer_sgd(lr, momentum)
        if weighting not in WEIGHTINGS:
            raise ValueError(f"outer.weighting: must be tokens, uniform or fednova, "
                             f"got {weighting!r}")
        if not (isinstance(min_replies, int) and min_replies >= 1):
            raise ValueError(f"outer.min_replies: must be an int >= 1, got {min_replies!r}")
        self.lr, self.momentum, self.nesterov, self.weighting = lr, momentum, nesterov, weighting
        self.min_replies = min_replies
        self.failed_rounds = 0
        self.optimizer = self.outer_optimizer()
        self.opt_state: Any = None
        self.round = 0
        self.dispatched: set[int] = set()
        self.results: dict[int, Update] = {}
        self.dropped: set[int] = set()  # out of this round (missed its deadline, retired)
        self.sampling = Sampling(fraction, min_workers, sample_by, overcommit, late)
        self.carried: list[Update] = []  # late replies for the next round (late = next)
        self.draws_rounds = self.sampling.active
        # whether a round may close before all its jobs are in (drawn rounds, or a server
        # that cuts a round at a deadline): a reply is then told apart as late
        self.cuts_rounds = self.draws_rounds
        self.drawn: set[int] | None = None  # this round's workers (None: not drawn yet)
        self.keep = 0  # replies this round closes at (0: every worker dispatched)
        self.round_version = -1  # the version this round's jobs start from
        self.discarded = 0  # updates of a closed round (over-committed): never applied
        self.facts: FleetFacts | None = None

    def outer_optimizer(self) -> T.Transform:
        """What turns a round's merged outer gradient into its step: the seam a
        subclass overrides for another outer optimizer (FedAdam: a few lines, the round
        bookkeeping untouched). Called once, at the end of ``__init__``."""
        return T.sgd(self.lr, self.momentum, self.nesterov)

    def on_fleet(self, facts: FleetFacts) -> None:
        workers = len(facts.step_times)  # the config check tells it too, before a run
        if self.min_replies > workers:  # no round could ever close short of its jobs
            raise ValueError(f"outer.min_replies: {self.min_replies} is more than the "
                             f"{workers} workers (a round short of replies would start "
                             f"over for ever)")
        if self.sampling.min_workers > workers:  # no round would ever be drawn
            raise ValueError(f"outer.min_workers: {self.sampling.min_workers} is more than "
                             f"the {workers} workers (no round would ever be drawn)")
        if self.sampling.late != "drop" and not self.cuts_rounds:  # none is ever late
            raise ValueError(f"outer.late: {self.sampling.late!r} is for replies that come "
                             f"after their round closed, and these rounds close only when "
                             f"every reply is in: set outer.fraction < 1 or "
                             f"outer.overcommit > 1")
        self.facts = facts

    def start(self, params, *, num_workers: int) -> None:
        self.opt_state = self.optimizer.init(params)

    def offered(self, workers: list[int], *, version: int) -> list[int] | None:
        if not self.awaits_draw or len(workers) < self.sampling.min_workers:
            return None  # drawn already, or too few available yet: wait for more
        facts, among = self.facts or FleetFacts(0, ()), sorted(workers)
        drawn, self.keep = self.sampling.draw(
            among, facts.seed, (self.round, self.failed_rounds),
            facts.data_sizes() if self.sampling.sample_by == "data" else None)
        self.drawn = set(drawn)
        return among

    @property
    def awaits_draw(self) -> bool:
        return self.draws_rounds and self.drawn is None

    def wants_job(self, worker: int, *, version: int) -> bool:
        # A worker takes part once per round; the next round opens at the barrier.
        if self.draws_rounds and (self.drawn is None or worker not in self.drawn):
            return False  # not drawn for this round (or the round not drawn yet)
        return worker not in self.dispatched and worker not in self.dropped

    def on_dispatch(self, worker: int, *, version: int) -> None:
        self.dispatched.add(worker)
        self.round_version = version

    def on_job_lost(self, worker: int, *, job_id: int, reason: str, params):
        if self.cuts_rounds and worker not in self.dispatched:
            return None  # a job of a round already closed (over-committed, cut)
        self.dispatched.discard(worker)
        if reason in ("error", "rejected"):
            return None  # the worker may take the round's job again
        self.dropped.add(worker)
        if len(self.results) < self._closes_at():
            return None  # others still running
        if len(self.results) >= self.min_replies:
            return self._aggregate(params)
        self.failed_rounds += 1  # too few replies: the round starts over
        self._next_round()
        return None

    def on_update(self, update: Update, params):
        if self.cuts_rounds and (update.worker not in self.dispatched
                                  or update.base_version != self.round_version):
            if self.sampling.late == "next":  # into the round open now: held until it closes
                self.carried.append(update)
                return None
            self.discarded += 1  # over-committed: the round closed without it
            return DROPPED
        self.results[update.worker] = update
        if len(self.results) < self._closes_at():
            return None  # barrier: wait for the round's slowest worker
        return self._aggregate(params)

    def _closes_at(self) -> int:
        """Replies the round waits for: every job still in it, at most the K it keeps."""
        waiting = len(self.dispatched)
        return min(self.keep, waiting) if self.drawn is not None and self.keep else waiting

    def _next_round(self) -> None:
        self.dispatched.clear()
        self.results.clear()
        self.dropped.clear()
        self.drawn = None

    def _aggregate(self, params):
        ordered = [self.results[w] for w in sorted(self.results)] + self.carried
        self.carried = []
        mean = self._merge(ordered)
        self.round += 1
        self._next_round()
        step, self.opt_state = self.optimizer.update(mean, self.opt_state, None)
        return T.descend(params, step)

    def _merge(self, ordered: list[Update]):
        """The round's outer gradients as one, by ``weighting`` (summed in worker order)."""
        grads = [u.outer_grad for u in ordered]
        if self.weighting == "fednova" and all(u.local_steps > 0 for u in ordered):
            return T.normalized_mean(grads, [u.local_steps for u in ordered])
        weights = [float(u.tokens) if self.weighting == "tokens" else 1.0 for u in ordered]
        if not sum(weights):  # a streaming run's last rounds train no token
            weights = [1.0] * len(ordered)
        return T.weighted_mean(grads, weights)

    def state_dict(self) -> dict[str, Any]:
        return {"opt_state": self.opt_state, "round": self.round,
                "dispatched": sorted(self.dispatched), "results": dict(self.results),
                "dropped": sorted(self.dropped), "failed_rounds": self.failed_rounds,
                "drawn": None if self.drawn is None else sorted(self.drawn),
                "keep": self.keep, "round_version": self.round_version,
                "discarded": self.discarded, "carried": list(self.carried)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.opt_state = state["opt_state"]
        self.round = state["round"]
        self.dispatched = set(state["dispatched"])
        self.results = dict(state["results"])
        self.dropped = set(state["dropped"])
        self.failed_rounds = state["failed_rounds"]
        drawn = state.get("drawn")  # a checkpoint from before sampling: none drawn
        self.drawn = None if drawn is None else set(drawn)
        self.keep = state.get("keep", 0)
        self.round_version = state.get("round_version", -1)
        self.discarded = state.get("discarded", 0)
        self.carried = list(state.get("carried", []))

    def summary(self) -> str:
        """One line of its settings; a subclass with another outer optimizer says its own
        (``outer_summary``), not outer SGD's."""
        s = self.sampling
        drawn = (f", rounds of {s.fraction:g} of the workers (at least {s.min_workers}, "
                 f"{s.sample_by}, overcommit {s.overcommit:g}, late replies {s.late})"
                 if s.active else "")
        return (f"{self.name}: sync rounds{drawn}, {self.outer_summary()}, weighting "
                f"{self.weighting}")

    def outer_summary(self) -> str:
        return f"outer SGD lr {self.lr}{momentum_text(self.momentum, self.nesterov)}"
