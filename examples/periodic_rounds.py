"""Periodic rounds: synchronous DiLoCo-style rounds closed by the server's clock.

Every ``server.period`` virtual seconds (a timer of the run's clock: ``wake_in`` /
``on_timer``, set at the start and again at each ring) the server closes the open
round with the replies it has: the round's jobs still out are cut (reported lost to
the strategy as ``"deadline"``, ``Rounds.cut``) and their workers keep computing. What
they send later is a late reply: dropped (``outer.late = "drop"``, the default) or
merged into the next round to close (``outer.late = "next"``): the kind declares that
it cuts rounds (``Serves(cuts_rounds=True)``), so a reply may be late. A round with no
reply yet when its period ends closes at its first reply.

    PYTHONPATH=examples fedlm run --set strategy=diloco \\
        --set server.kind=periodic_rounds:PeriodicRounds --set server.period=20 \\
        --set outer.late=next

For any synchronous strategy whose rounds are fedlm's ``Rounds`` (``diloco``,
``fedavg``, ``Synchronous`` plug-ins). Simplified: the periods run from the start of
the run, not from each round's opening; a period longer than the run leaves it as the
strategy alone would run it, bit for bit.
"""

import math
from dataclasses import dataclass

from fedlm.servers import Server, Serves
from fedlm.strategies.traits import traits

SOURCE = ("fedlm's own: synchronous rounds closed every server.period virtual seconds "
          "with the replies in; late work dropped or merged into the next round")


@dataclass(frozen=True)
class PeriodSettings:
    period: float = 60.0  # virtual seconds between two closes of the open round

    def __post_init__(self) -> None:
        if not 0 < self.period < math.inf:  # also NaN
            raise ValueError(f"server.period: must be seconds in (0, inf), got {self.period!r}")


class PeriodicRounds(Server):
    """One server whose synchronous rounds close every ``server.period`` seconds."""

    serves = Serves(cuts_rounds=True)  # a reply may come after its round closed
    Settings = PeriodSettings
    state_fields = ("alarm", "jobs")

    @classmethod
    def check(cls, cfg, strategy) -> None:
        if not traits(strategy).synchronous:
            raise ValueError(f"periodic_rounds:PeriodicRounds closes synchronous rounds; "
                             f"{cfg.strategy!r} has none")

    def start_strategy(self, params, fleet) -> None:
        super().start_strategy(params, fleet)
        self.jobs = {}  # worker -> id of its latest job (what a cut reports lost)
        self.alarm = self.wake_in(self.settings.period)  # a resume keeps the engine's

    def send(self, job, start):
        self.jobs[job.worker] = job.job_id
        return super().send(job, start)

    def on_timer(self, key):
        if key != self.alarm:
            return super().on_timer(key)  # not ours: refused
        self.alarm = self.wake_in(self.settings.period)  # the next period
        new = None
        for worker in self.strategy.rounds.cut():  # the last one lost closes the round
            new = self.lose(worker, job_id=self.jobs[worker], reason="deadline") or new
        return new

