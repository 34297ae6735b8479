"""Follower: the run store's new progress points, handed to the trackers.

``fedlm run`` makes one before training (``Follower.of``), ``begin``s it when
the run has an id, ``poll``s it on each progress report (at most every
``every`` seconds: a tracker writes files or a database), one evaluation behind
(``poll`` says why), and ``end``s it when the run is over, with the run's final
status. ``fedlm export --track`` (``export``) does begin and end in one go on a
stored run. Whatever a tracker raises drops that tracker, with one line on
stderr; so does a call that takes longer than ``Follower.timeout``: the run never
fails, nor waits, for it.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from fedlm import store
from fedlm.config import Config
from fedlm.errors import first_line
from fedlm.track.backends import open_trackers
from fedlm.track.record import TrackedRun


class Follower:
    timeout = 20.0  # seconds a tracker may take to start, log a point or finish

    def __init__(self, db: str | Path, cfg: Config, trackers: list, every: float = 2.0) -> None:
        self.db = db
        self.cfg = cfg
        self.trackers = list(trackers)
        self.every = every
        self.run_id: int | None = None
        self.last = 0  # the last progress point handed on (its metrics row id)
        self.sent = 0  # progress points handed on
        self._polled = float("-inf")

    @classmethod
    def of(cls, db: str | Path, cfg: Config, every: float = 2.0) -> "Follower | None":
        """A follower for ``cfg.track.backends``, or None if the config names none."""
        if not cfg.track.backends:
            return None
        return cls(db, cfg, open_trackers(cfg.track), every)

    def _each(self, what: str, call) -> None:
        for tracker in list(self.trackers):
            try:
                self._bounded(call, tracker)
            except Exception as exc:  # a tracker's trouble is never the run's
                self.trackers.remove(tracker)
                # on a line of its own: a progress bar may hold the current one
                print(f"\nfedlm: tracking: {tracker.name} failed to {what} "
                      f"({type(exc).__name__}: {first_line(exc)}); the run goes on without it",
                      file=sys.stderr, flush=True)

    def _bounded(self, call, tracker) -> None:
        """``call(tracker)``, given at most ``timeout`` seconds: a tracker whose server
        does not answer (an MLflow URI nobody listens on retried for minutes) must not
        hold the run up, nor a stop signal. Past the time it is dropped; its thread,
        a daemon, is left to finish or die with the process."""
        outcome: list = []

        def target() -> None:
            try:
                call(tracker)
                outcome.append(None)
            except BaseException as exc:  # handed to the caller's thread
                outcome.append(exc)

        thread = threading.Thread(target=target, name=f"tracker-{tracker.name}", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if not outcome:
            raise TimeoutError(f"no answer within {self.timeout:g} s")
        if outcome[0] is not None:
            raise outcome[0]

    def begin(self, run_id: int) -> None:
        self.run_id = run_id
        row = store.run_row(self.db, run_id)
        run = TrackedRun.of(self.cfg, run_id, self.db, label=row["name"] if row else "")
        self._each("start", lambda t: t.start(run))

    def poll(self, final: bool = False) -> None:
        """Hand on the points settled since the last poll (at most every ``every``
        seconds, unless ``final``).

        A point is settled once the next evaluation is in the store (or the run is
        over): a row timed at or before an evaluation may be written just after it
        (the jobs sent out at that instant, a span that ended before it), and a
        tracker gets each point once. So live tracking runs one evaluation behind,
        and gives exactly what ``export`` gives afterwards."""
        now = time.monotonic()
        if self.run_id is None or not self.trackers or (not final and
                                                         now - self._polled < self.every):
            return
        self._polled = now
        points = store.progress_points(self.db, self.run_id, after=self.last)
        for point in points if final else points[:-1]:
            self._each("log", lambda t: t.log(point))
            self.last = point.id
            self.sent = self.sent + 1

    def end(self) -> None:
        """Hand on the last points and close each tracker run with the run's status."""
        if self.run_id is None:
            return
        self.poll(final=True)
        row = store.run_row(self.db, self.run_id)
        status = store.shown_status(row) if row is not None else "failed"
        self._each("finish", lambda t: t.finish(status))


class Exported(NamedTuple):
    run_id: int
    trackers: list[str]
    points: int  # progress points handed to the trackers
    folder: str  # the trackers' local folder

    def __str__(self) -> str:  # what `fedlm export --track` and `fedlm deploy` print
        return (f"run {self.run_id}: {self.points} progress points to "
                f"{', '.join(self.trackers)} under {self.folder}")


def export(db: str | Path, run_id: int, names: list[str], folder: str | None = None) -> Exported:
    """Send run ``run_id`` of ``db``, whatever its state, to the trackers ``names``:
    the same tracker runs that following it live gives (``fedlm export --track``).
    ``folder``: the trackers' local folder instead of the run's ``track.dir``."""
    from fedlm import config_load

    cfg = config_load.from_dict(store.config_of(db, run_id))
    track = replace(cfg.track, backends=list(dict.fromkeys(names)),
                    dir=folder if folder is not None else cfg.track.dir)
    cfg = replace(cfg, track=track)
    follower = Follower(db, cfg, open_trackers(track))
    follower.begin(run_id)
    follower.end()
    return Exported(run_id, track.backends, follower.sent, track.dir)
