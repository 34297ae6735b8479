"""Synchronous rounds: who is in the open round, what arrived, when it closes, and what
becomes of lost and late replies (``Rounds``); and the strategy base whose hooks are
its Rounds, so that a synchronous strategy writes only its merge (``Synchronous``).

A round opens at a version. Its workers are every free worker, or K of those available
drawn by ``Sampling`` (client sampling, over-commitment); each takes one job from that
version. The round closes when

    replies >= min(K, jobs still in it)       (every job still in it, when not drawn)

and its replies, in worker order (float sums reproducible), then the late replies it
takes (``late = "next"``), in order of arrival, go to the strategy's merge
(``Synchronous.close``). A job lost in error or rejected is asked again in the same
round; one that missed its deadline, or whose worker retired or left, takes its worker
out of the round, which closes with the replies it has: at least ``min_replies``, else
it starts over from the same version. A reply to a round already closed is late (a
round may close before all its jobs are in: drawn rounds, or a server kind that cuts
them): merged into the next round that closes (``late = "next"``), or dropped.

A server kind that closes rounds itself (a deadline, a fixed period; it declares
``Serves(cuts_rounds=True)``, and its strategy's rounds are told so before
``on_fleet``: ``rounds_cut_by_server``; a strategy class of an older fedlm said so itself,
``cut_by_server = True``) calls ``cut()`` when the time comes and reports the jobs
it names lost (reason ``"deadline"``); a round that has fewer than ``min_replies`` then
is overdue, and closes at the reply that brings it there.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from fedlm.strategies.base import DROPPED, FleetFacts, Strategy, Update
from fedlm.strategies.sampling import Sampling


class Rounds:
    """The open round's bookkeeping, with its settings (``outer.min_replies`` and the
    sampling settings) and its state (``state_dict``: the layout FedAvg's checkpoints
    have always had)."""

    def __init__(self, min_replies: int = 1, *, cut_by_server: bool = False,
                 **sampling: Any) -> None:
        if not (isinstance(min_replies, int) and min_replies >= 1):
            raise ValueError(f"outer.min_replies: must be an int >= 1, got {min_replies!r}")
        self.min_replies = min_replies
        self.sampling = Sampling(**sampling)
        # whether a round may close before all its jobs are in: a reply is then told apart
        # as late (drawn rounds, or a server kind that cuts them: its strategy's class says
        # so, or the kind sets it before its start)
        self.cuts = self.sampling.active or cut_by_server
        self.facts: FleetFacts | None = None  # the seed and the data a draw reads
        self.round = 0  # rounds closed
        self.failed_rounds = 0  # rounds started over, short of min_replies
        self.discarded = 0  # late replies dropped (late = "drop"): never applied
        self.dispatched: set[int] = set()  # workers given this round's job (replied or not)
        self.results: dict[int, Update] = {}  # worker -> its reply, in order of arrival
        self.dropped: set[int] = set()  # out of this round (missed its deadline, retired)
        self.carried: list[Update] = []  # late replies the next round to close takes
        self.drawn: set[int] | None = None  # this round's workers (None: not drawn yet)
        self.keep = 0  # replies this round closes at (0: every job still in it)
        self.round_version = -1  # the version this round's jobs start from
        self.overdue = False  # cut short of min_replies: closes at the reply bringing it there

    @property
    def draws(self) -> bool:
        """Whether each round's workers are drawn (else every free worker takes part)."""
        return self.sampling.active

    @property
    def awaits_draw(self) -> bool:
        return self.draws and self.drawn is None

    def on_fleet(self, facts: FleetFacts) -> None:
        """Refuse settings no round of this fleet could meet; keep what draws read."""
        workers = len(facts.step_times)
        if self.min_replies > workers:  # no round could ever close short of its jobs
            raise ValueError(f"outer.min_replies: {self.min_replies} is more than the "
                             f"{workers} workers (a round short of replies would start "
                             f"over for ever)")
        if self.sampling.min_workers > workers:  # no round would ever be drawn
            raise ValueError(f"outer.min_workers: {self.sampling.min_workers} is more than "
                             f"the {workers} workers (no round would ever be drawn)")
        if self.sampling.late != "drop" and not self.cuts:  # no reply is ever late
            raise ValueError(f"outer.late: {self.sampling.late!r} is for replies that come "
                             f"after their round closed, and these rounds close only when "
                             f"every reply is in: set outer.fraction < 1 or "
                             f"outer.overcommit > 1")
        self.facts = facts

    def draw(self, workers: list[int]) -> list[int] | None:
        """The next round's workers, drawn from ``workers`` (free and present): returns
        those it drew from, or None (drawn already, or too few yet: it waits for more)."""
        if not self.awaits_draw or len(workers) < self.sampling.min_workers:
            return None
        facts = self.facts or FleetFacts(0, ())
        among = sorted(workers)
        data = facts.data_sizes() if self.sampling.sample_by == "data" else None
        drawn, self.keep = self.sampling.draw(among, facts.seed,
                                              (self.round, self.failed_rounds), data)
        self.drawn = set(drawn)
        return among

    def wants_job(self, worker: int) -> bool:
        """Once per round, for a worker drawn for it (when drawn) and not out of it."""
        if self.draws and (self.drawn is None or worker not in self.drawn):
            return False
        return worker not in self.dispatched and worker not in self.dropped

    def dispatch(self, worker: int, version: int) -> None:
        self.dispatched.add(worker)
        self.round_version = version

    def arrived(self, update: Update) -> Any:
        """Whether the round closes now that ``update`` is in; ``DROPPED`` for a late
        reply dropped (a late one held for the next round: False)."""
        if self.cuts and (update.worker not in self.dispatched
                          or update.base_version != self.round_version):
            if self.sampling.late == "next":
                self.carried.append(update)
                return False
            self.discarded += 1  # its round closed without it
            return DROPPED
        self.results[update.worker] = update
        return len(self.results) >= self.closes_at()

    def lost(self, worker: int, reason: str) -> bool:
        """Whether the round closes now that ``worker``'s job is lost (``reason``: the
        Strategy's); a round left short of ``min_replies`` starts over."""
        if self.cuts and worker not in self.dispatched:
            return False  # a job of a round already closed
        self.dispatched.discard(worker)
        if reason in ("error", "rejected"):
            return False  # the worker may take the round's job again
        self.dropped.add(worker)
        if len(self.results) < self.closes_at():
            return False  # others still running
        if len(self.results) >= self.min_replies:
            return True
        self.failed_rounds += 1  # too few replies: the round starts over (overdue still)
        self._clear()
        return False

    def cut(self) -> list[int]:
        """The round's time is up (a server kind's timer): the workers whose jobs to
        report lost (``"deadline"``), in worker order; none while it has fewer than
        ``min_replies`` replies, and it then closes at the reply that brings it there."""
        waiting = sorted(self.dispatched - set(self.results))
        if waiting and len(self.results) < self.min_replies:
            self.overdue = True
            return []
        return waiting

    def closes_at(self) -> int:
        """The replies the round closes at: every job still in it, at most the K it
        keeps, at most ``min_replies`` once overdue."""
        waiting = len(self.dispatched)
        at = min(self.keep, waiting) if self.drawn is not None and self.keep else waiting
        return min(at, self.min_replies) if self.overdue else at

    def replies(self) -> list[Update]:
        """The closing round's replies in worker order, then the late ones it takes."""
        return [self.results[w] for w in sorted(self.results)] + self.carried

    def closed(self) -> None:
        """The round's replies were merged: it counts, and the next one opens."""
        self.round += 1
        self.carried = []
        self.overdue = False
        self._clear()

    def _clear(self) -> None:
        self.dispatched.clear()
        self.results.clear()
        self.dropped.clear()
        self.drawn = None

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "dispatched": sorted(self.dispatched),
                "results": dict(self.results), "dropped": sorted(self.dropped),
                "failed_rounds": self.failed_rounds,
                "drawn": None if self.drawn is None else sorted(self.drawn),
                "keep": self.keep, "round_version": self.round_version,
                "discarded": self.discarded, "carried": list(self.carried),
                "overdue": self.overdue}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """``state_dict``'s, or an older one: FedAvg's before sampling or the deadline
        cut (missing keys: their start), or a plug-in's own barrier of before Rounds
        (``running``, ``out``, ``grads``: TrimmedMean's and DesLoc's)."""
        if "running" in state:
            state = _from_barrier(state)
        self.round = state.get("round", 0)
        self.dispatched = set(state["dispatched"])
        self.results = dict(state["results"])
        self.dropped = set(state["dropped"])
        self.failed_rounds = state.get("failed_rounds", 0)
        drawn = state.get("drawn")
        self.drawn = None if drawn is None else set(drawn)
        self.keep = state.get("keep", 0)
        self.round_version = state.get("round_version", -1)
        self.discarded = state.get("discarded", 0)
        self.carried = list(state.get("carried", []))
        self.overdue = state.get("overdue", False)


def _from_barrier(state: dict[str, Any]) -> dict[str, Any]:
    """A plug-in's barrier of before Rounds: the jobs outstanding (``running``), the
    workers out of the round (``out``), the outer gradients in (``grads``), as Rounds'."""
    results = {w: Update(worker=w, job_id=-1, base_version=-1, outer_grad=g, tokens=0,
                         local_steps=0, staleness=0) for w, g in state["grads"].items()}
    return {"dispatched": [*state["running"], *results], "results": results,
            "dropped": state["out"]}


class Synchronous(Strategy):
    """A synchronous strategy: the engine's hooks are answered by its ``Rounds``
    (``self.rounds``); a subclass writes what a closed round's replies make (``close``)
    and keeps its own state beside the round's (``state_dict``)."""

    synchronous = True
    cut_by_server: ClassVar[bool] = False  # True: its server kind cuts rounds (a deadline)

    def __init__(self, *, min_replies: int = 1, fraction: float = 1.0, min_workers: int = 1,
                 sample_by: str = "uniform", overcommit: float = 1.0,
                 late: str = "drop") -> None:
        self.rounds = Rounds(min_replies, cut_by_server=self.cut_by_server,
                             fraction=fraction, min_workers=min_workers,
                             sample_by=sample_by, overcommit=overcommit, late=late)

    @abstractmethod
    def close(self, replies: list[Update], params) -> Any:
        """The closed round's ``replies`` (``Rounds.replies``: worker order, then late
        ones) merged into what ``params`` becomes: the new global params."""

    def on_fleet(self, facts: FleetFacts) -> None:
        self.rounds.on_fleet(facts)

    def wants_job(self, worker: int, *, version: int) -> bool:
        return self.rounds.wants_job(worker)

    def on_dispatch(self, worker: int, *, version: int) -> None:
        self.rounds.dispatch(worker, version)

    def on_update(self, update: Update, params):
        closes = self.rounds.arrived(update)
        if closes is DROPPED:
            return DROPPED
        return self._close(params) if closes else None  # None: the barrier holds

    def on_job_lost(self, worker: int, *, job_id: int, reason: str, params):
        return self._close(params) if self.rounds.lost(worker, reason) else None

    def _close(self, params):
        new = self.close(self.rounds.replies(), params)  # rounds.results: the round's still
        self.rounds.closed()
        return new

    def state_dict(self) -> dict[str, Any]:
        return self.rounds.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds.load_state_dict(state)


def rounds_cut_by_server(strategy: Strategy) -> None:
    """``strategy``'s server kind closes its rounds itself (``Serves.cuts_rounds``): a
    reply may then come after its round closed, and is told apart as late. Told before
    ``on_fleet``, which checks ``outer.late`` against it."""
    if isinstance(strategy, Synchronous):
        strategy.rounds.cuts = True
