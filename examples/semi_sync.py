"""Semi-synchronous rounds that close at a deadline set from the recent arrivals, as a
fedlm plug-in (a strategy and its server kind).

A synchronous round waits for its slowest member. Here a round also closes when its
deadline passes, with the replies it has (with fewer than ``outer.min_replies`` it
waits on for the reply that brings it there); its stragglers keep computing, and their
work joins the round open when they reply (``outer.late = "next"``, the default here)
or is dropped (``"drop"``).
The deadline follows the fleet, as a hivemind proposal (learning-at-home/hivemind
#676) sets it and Decoupled DiLoCo's adaptive grace does:

    deadline = median(d) + k · MAD(d)        MAD(d) = median(|d − median(d)|)

where d are the times from their round's opening to the last
``server.deadline_window`` replies taken and k = ``server.deadline_k`` (the server's
settings: ``DeadlineSettings``); the MAD counts as at least 5% of the
median (fill's jobs end together: a MAD of 0 would cut every reply after the median).
The first round, with no history, has no deadline. A round also closes at its quorum,
as any drawn round does (``outer.fraction``, ``outer.overcommit``): the deadline only
cuts a round short. A worker that comes back or frees up mid-round joins the round
open then, as in ``diloco-fill`` (fill sizes its job to the time left); a reply to a
round already closed is late. With no deadline reached the two are the same bit for
bit.

The deadline is a wake-up the server asks of the run's clock when the round's first job
is dispatched (``Server.wake_in(deadline)``, answered by ``on_timer``), an operation of
the run log, so a run replays and resumes bit for bit. On the wall clock (Flower) a
job's duration is not known at dispatch: no deadline is set there. fedlm's own
combination: fill's job sizes (``diloco-fill``), DiLoCo's outer step, drawn rounds
closed at a quorum or a deadline.

    PYTHONPATH=examples fedlm run --set strategy=semi_sync:SemiSyncFill \\
        --set server.deadline_k=2 --set profile=halos --set workers=8
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

from fedlm.servers import Sent, Server, Serves
from fedlm.strategies.base import Update
from fedlm.strategies.diloco_fill import DiLoCoFill

SOURCE = ("fedlm's own: fill's rounds that close at a quorum or at a deadline of median + "
          "k x MAD of recent reply times (after hivemind #676), stragglers' work into the "
          "next round")


def deadline_of(durations: list[float], k: float) -> float:
    """median + k · MAD of ``durations``, the MAD at least 5% of the median: fill's jobs
    end together, and a MAD of 0 would cut every reply later than the median."""
    mid = statistics.median(durations)
    mad = statistics.median(abs(d - mid) for d in durations)
    return mid + k * max(mad, 0.05 * mid)


class SemiSyncFill(DiLoCoFill):
    """DiLoCo on fill's job sizes whose rounds close at a quorum or a deadline."""

    name = "semi-sync-fill"
    source = SOURCE
    default_server = "semi_sync:DeadlineServer"
    # its rounds are cut by a server (its default late = "next" means nothing else),
    # whichever kind the config names: one that cannot cut them is refused as such
    cut_by_server = True

    def __init__(self, *, late: str = "next", **settings) -> None:
        super().__init__(late=late, **settings)


@dataclass(frozen=True)
class DeadlineSettings:
    """The deadline server's settings (``[server]``; ``outer.deadline_*`` before)."""

    deadline_k: float = 2.0  # k: the deadline is median + k x MAD of recent reply times
    deadline_window: int = 16  # the reply times it reads: the last ones taken
    OLD_NAMES: ClassVar[dict[str, str]] = {"deadline_k": "deadline_k",
                                           "deadline_window": "deadline_window"}

    def __post_init__(self) -> None:
        if not 0 <= self.deadline_k < math.inf:
            raise ValueError(f"server.deadline_k: must be a number >= 0, got "
                             f"{self.deadline_k!r}")
        if self.deadline_window < 1:
            raise ValueError(f"server.deadline_window: must be >= 1, got "
                             f"{self.deadline_window!r}")


class DeadlineServer(Server):
    """One server that sets each round a deadline from the recent reply times; the round
    itself (who is in, what arrived, when it closes) is its strategy's ``Rounds``."""

    serves = Serves(cuts_rounds=True)  # it cuts rounds at their deadline (Rounds.cut)
    Settings = DeadlineSettings
    state_fields = ("armed", "jobs", "replies", "durations", "timed", "opened", "clocked",
                    "timers")

    @classmethod
    def check(cls, cfg, strategy) -> None:
        if not issubclass(strategy, SemiSyncFill):
            raise ValueError(f"semi_sync:DeadlineServer serves semi_sync:SemiSyncFill (its "
                             f"deadline settings), not {cfg.strategy!r}")

    def start(self, params, fleet: list) -> None:
        super().start(params, fleet)
        self.rounds = self.strategy.rounds  # the open round, closed by its strategy's rules
        self.armed = -1  # the round whose timer is set
        self.jobs: dict[int, int] = {}  # worker -> its latest job's id (what a cut loses)
        self.replies = 0  # replies taken
        self.durations: list[float] = []  # of the last replies taken, oldest first
        self.timed: dict[int, float] = {}  # job id -> its reply's time since its round opened
        self.opened: tuple[int, float] = (-1, 0.0)  # the open round, and when it opened
        self.clocked: bool | None = None  # whether jobs are timed (None: not told, replay)
        self.timers: dict[int, int] = {}  # key -> the round it closes

    def send(self, job, start) -> Sent:
        self.jobs[job.worker] = job.job_id
        return super().send(job, start)

    def timing(self, sent: Sent, events, index: int):
        timing = super().timing(sent, events, index)
        self.clocked = timing is not None
        if timing is not None:
            if self.opened[0] != self.rounds.round:  # the round's first job: it opens now
                self.opened = (self.rounds.round, events.now)
            # its reply's time since its round opened (a job handed out mid-round, to a
            # worker that came back, counts the wait before it too)
            self.timed[sent.job.job_id] = events.now - self.opened[1] + timing.total
        return timing

    def dispatched(self, worker: int, version: int) -> None:
        super().dispatched(worker, version)
        if self.armed == self.rounds.round or not self.replies or self.clocked is False:
            return  # armed already; no reply time seen yet; the wall clock
        # the round's first job: its deadline, a wake-up of the run's clock (replay: the
        # order alone decides that there is one; when it rang is in the run log)
        self.armed = self.rounds.round
        seconds = (deadline_of(self.durations, self.settings.deadline_k)
                   if self.durations else 0.0)
        self.timers[self.wake_in(seconds)] = self.rounds.round

    def take(self, update: Update):
        self.replies += 1
        seconds = self.timed.pop(update.job_id, None)
        if seconds is not None:
            self.durations = (self.durations + [seconds])[-self.settings.deadline_window:]
        return super().take(update)  # an overdue round closes at its min_replies-th reply

    def lose(self, worker: int, *, job_id: int, reason: str):
        self.timed.pop(job_id, None)
        return super().lose(worker, job_id=job_id, reason=reason)

    def on_timer(self, key: int):
        """A round's deadline: if it is still open, its jobs not in are cut from it and it
        closes with the replies it has; with fewer than ``outer.min_replies`` it waits
        on, and closes at the reply that brings it there (``Rounds.cut``)."""
        if self.timers.pop(key) != self.rounds.round:
            return None  # it closed at its quorum already
        new = None
        for worker in self.rounds.cut():
            new = self.strategy.on_job_lost(worker, job_id=self.jobs[worker],
                                            reason="deadline", params=self.params) or new
        return new

    def deliver(self, key: int) -> tuple[Any | None, int]:
        """The log of a run of an older fedlm, where a deadline came as a message to
        itself (its arrival a transfer op): the same wake-up, under the same key."""
        return self.on_timer(key), 0

    def load_state_dict(self, state: dict, checkpoint: dict | None = None) -> None:
        # a checkpoint of before Rounds: the round's jobs in "out", overdue here
        super().load_state_dict({"jobs": state.get("out", {}), **state}, checkpoint)
        self.rounds.overdue = self.rounds.overdue or state.get("overdue", False)

    def describe(self) -> str:
        return (f"a round also closes at median + {self.settings.deadline_k:g} x MAD of the "
                f"last {self.settings.deadline_window} reply times")
