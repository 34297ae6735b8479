"""When a run can make no progress: every job is lost, or no update makes a version.

A run whose every job departs before it ends (presence windows shorter than any job:
``fleet.availability``, an availability trace at a tiny ``fleet.trace_time_scale``),
misses its deadline, or whose strategy takes updates but never makes a version (a
plug-in that drops them all; a sync round that starts over below ``min_replies``
forever) would otherwise loop without end, on the virtual clock as on the wall clock.
The engine tells this watch each job's end and each new version, and stops the run
with one line that says why once

- ``lost_limit(workers)`` jobs in a row have been lost (no update accepted between
  them): max(50, 10 x workers);
- ``held_limit(workers)`` updates in a row have been accepted without a new version:
  max(200, 20 x workers) (a sync round needs one per worker, a buffer K of them);
- ``lost_limit(workers)`` of the server kind's wake-ups in a row have rung with no job
  in flight and made no version (a timer that sets itself again for ever, while no
  worker gets a job), or ``held_limit(workers)`` rang at one instant (one that sets
  itself again in 0 s: the clock would never move on).

The counts are in jobs and wake-ups, so a stop comes at the same point on a replayed
or resumed run; in time it comes after that many jobs' durations (or periods). Crashing workers are retired
long before (``reliability.max_failures``); this catches what retiring does not
(departures do not count towards it, and dropped updates are not failures).
"""

from __future__ import annotations

from collections import Counter


def lost_limit(workers: int) -> int:
    return max(50, 10 * workers)


def held_limit(workers: int) -> int:
    return max(200, 20 * workers)


_WHY = {  # what a run of lost jobs of one kind means
    "departed": "no job fits in its worker's presence window (fleet.availability, "
                "fleet.availability_trace and fleet.trace_time_scale, fleet.leave)",
    "deadline": "every job misses its deadline (reliability.deadline, deadline_factor)",
}


class StallWatch:
    def __init__(self, workers: int) -> None:
        self.lost_max = lost_limit(workers)
        self.held_max = held_limit(workers)
        self.lost: Counter[str] = Counter()  # reasons of the jobs lost in a row
        self.held = 0  # updates accepted since the last version
        self.quiet = 0  # wake-ups in a row that rang with no job in flight, and no version
        self.instant = (-1.0, 0)  # the clock's time of the last wake-ups, and how many

    def job_lost(self, reason: str) -> None:
        self.lost[reason] += 1

    def update_accepted(self) -> None:
        self.lost.clear()
        self.held += 1

    def new_version(self) -> None:
        self.lost.clear()
        self.held = 0
        self.quiet = 0

    def rang(self, busy: bool, now: float) -> None:
        """A wake-up of the server kind is due at ``now``; ``busy``: a job is in flight."""
        self.quiet = 0 if busy else self.quiet + 1
        at, count = self.instant
        self.instant = (now, count + 1 if now == at else 1)

    @staticmethod
    def stuck(in_flight, offline, events, messages) -> bool:
        """Nothing in flight (no job, no message between servers or wake-up a server kind
        waits for: ``messages``), and nobody coming back who could change that (a worker
        gone for good is offline with no return on the virtual clock)."""
        waiting = offline and not (events.lookahead and events.next_time() is None)
        return not in_flight and not messages and not waiting

    def why_stalled(self, version: int, strategy: str) -> str | None:
        """None while the run may go on, else the one-line reason it cannot."""
        lost = sum(self.lost.values())
        if lost >= self.lost_max:
            kinds = ", ".join(f"{r} {n}" for r, n in self.lost.most_common())
            why = _WHY.get(self.lost.most_common(1)[0][0], "every job is lost") \
                if len(self.lost) == 1 else "every job is lost"
            return (f"no progress at version {version}: the last {lost} jobs were all lost "
                    f"({kinds}): {why}")
        at, count = self.instant
        if count >= self.held_max:  # the clock would never move on
            return (f"no progress at version {version}: the server kind's last {count} "
                    f"wake-ups rang at one instant ({at:g} s): a wake-up in 0 s that sets "
                    f"itself again")
        if self.quiet >= self.lost_max:
            return (f"no progress at version {version}: the server kind's last {self.quiet} "
                    f"wake-ups rang with no job in flight and made no version (a timer "
                    f"that sets itself again while no worker gets a job)")
        if self.held >= self.held_max:
            return (f"no progress at version {version}: {self.held} updates in a row made no "
                    f"new version: strategy {strategy!r} holds or drops every update (a "
                    f"staleness bound, a buffer, a quorum it never reaches?)")
        return None

    def state_dict(self) -> dict:
        return {"lost": dict(self.lost), "held": self.held, "quiet": self.quiet,
                "instant": list(self.instant)}

    def load_state_dict(self, st: dict) -> None:
        self.lost = Counter(st.get("lost", {}))
        self.held = st.get("held", 0)
        self.quiet = st.get("quiet", 0)  # a checkpoint of before wake-ups has none
        at, count = st.get("instant", (-1.0, 0))
        self.instant = (float(at), int(count))
