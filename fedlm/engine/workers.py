"""The worker pool: who is free, busy, offline or retired, and since when.

It also keeps, per worker, the job count (which seeds each job's data and
faults), the run of failures that retires a worker, and the last job whose
update was accepted: the optimizer state its next job starts from
(``fedlm.worker.states``). Checkpoints pin those states so that resume finds them.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from fedlm.config import Config
from fedlm.job import FRESH
from fedlm.sim import faults
from fedlm.store import IntervalKind


class WorkerPool:
    def __init__(self, cfg: Config, num_workers: int) -> None:
        self.cfg = cfg
        self.num_workers = num_workers
        self.free_since: dict[int, float] = {}  # free worker -> time it became free
        # free workers left out of the round open (client sampling): their span since
        # free_since is not drawn, not idle (IntervalKind.NOT_DRAWN); only the timeline's
        # kinds read it, never what a job is given
        self.not_drawn: set[int] = set()
        self.offline: dict[int, tuple[float, float]] = {}  # worker -> (since, until)
        # those of them that are absent (a fleet that changes over time), not offline
        # after an injected fault; until = inf: left for good
        self.absent: set[int] = set()
        self.retired: set[int] = set()
        self.failures = [0] * num_workers  # failed jobs in a row
        self.jobs_of = [0] * num_workers  # jobs dispatched so far
        self.state_job = [FRESH] * num_workers  # last accepted job: its next start state
        self.pins: list[list[int]] = []  # state_job at each kept checkpoint
        # Offer jobs to a free worker when it becomes free and again whenever the
        # global version changes (or a cap blocked someone): a sync barrier then
        # costs one scan per round, not one per finished job.
        self.newly_free: list[int] = []
        self.scanned_version = -1
        self.blocked = False
        self.sampler = np.random.default_rng([cfg.seed, 15485863])
        self._taken = 0  # workers taken from free_since since it was last copied

    def start(self, now: float) -> None:
        self.free_since = {w: now for w in range(self.num_workers)}

    def _next_scan(self, version: int) -> list[int] | None:
        """Start a scan: None if every free worker is to be offered a job (the version
        changed, or a cap blocked someone), else those that became free since the last."""
        full = version != self.scanned_version or self.blocked
        fresh = None if full else [w for w in self.newly_free if w in self.free_since]
        self.newly_free = []
        self.scanned_version = version
        self.blocked = False
        return fresh

    def _sample(self, n: int, in_flight: int):
        """More candidates than slots: a uniform order of the ``n`` available (seeded), as
        FedScale does, instead of favouring low indices; None if all fit."""
        cap = self.cfg.max_in_flight
        return self.sampler.permutation(n) if cap and n > cap - in_flight else None

    def candidates(self, version: int, in_flight: int) -> Iterable[int]:
        """Free workers to offer a job, in the order they are offered (the caller stops
        when the slots are full: a sampled order is drawn whole, read as far as needed)."""
        fresh = self._next_scan(version)
        pool = list(self.free_since) if fresh is None else fresh
        order = self._sample(len(pool), in_flight)
        return sorted(pool) if order is None else (pool[i] for i in order)

    def pass_over(self, version: int, in_flight: int) -> None:
        """A scan in which every worker would be refused (the local-step budget is spent):
        what ``candidates`` and the engine's walk of it leave behind (this bookkeeping, the
        sampler's draw, a full cap blocking), without listing the free workers."""
        fresh = self._next_scan(version)
        n = len(self.free_since) if fresh is None else len(fresh)
        if self._sample(n, in_flight) is not None and in_flight >= self.cfg.max_in_flight:
            self.blocked = True  # the engine's walk stops at the first, the slots full

    def take(self, w: int) -> tuple[int, float]:
        """``w`` gets a job: returns the job's index among ``w``'s jobs and since when
        ``w`` was free."""
        index = self.jobs_of[w]
        self.jobs_of[w] += 1
        since = self.free_since.pop(w)
        self.not_drawn.discard(w)
        self._taken += 1
        if self._taken > 2 * len(self.free_since) + 64:
            # A dict keeps the slots of removed keys until it grows again, and walking it
            # walks them too: after a fleet's first dispatch, every scan of the few free
            # workers would cost as many as there are workers. A copy has only the free
            # ones, in the same order.
            self.free_since = dict(self.free_since)
            self._taken = 0
        return index, since

    def free_kind(self, w: int) -> IntervalKind:
        """What free worker ``w`` has been doing since ``free_since[w]``: waiting for
        work (idle), or left out of the round open (not drawn)."""
        return IntervalKind.NOT_DRAWN if w in self.not_drawn else IntervalKind.IDLE

    def left_out(self, workers: Iterable[int], now: float, version: int) -> list:
        """A round was drawn now without the free ``workers``: each is not drawn from
        now. Returns the rows of the idle time each had before (none where it had none)."""
        rows = []
        for w in workers:
            if w in self.not_drawn or w not in self.free_since:
                continue  # left out of the round before too: one span on
            if now > self.free_since[w]:
                rows.append((w, IntervalKind.IDLE, self.free_since[w], now, version, None))
            self.free_since[w] = now  # a key already there: the dict's order is kept
            self.not_drawn.add(w)
        return rows

    def round_over(self, now: float, version: int,
                   absent_since: Callable[[int, float], float | None] | None = None) -> list:
        """The round that left workers out is over (the next is not drawn yet): they are
        idle from now, as everyone free. Returns the rows of their not-drawn spans, each
        cut where ``absent_since`` (a fleet that changes) says its worker went away: the
        scan that follows finds it absent from then (``Presence.gone_away``)."""
        rows = []
        for w in sorted(self.not_drawn):
            away = absent_since(w, now) if absent_since is not None else None
            end = now if away is None else min(now, max(away, self.free_since[w]))
            if end > self.free_since[w]:
                rows.append((w, IntervalKind.NOT_DRAWN, self.free_since[w], end, version, None))
                self.free_since[w] = end
        self.not_drawn.clear()
        return rows

    def keep_from(self, w: int) -> int:
        """The oldest state of ``w`` still needed: by its next job or a kept checkpoint."""
        return min([self.state_job[w], *(pin[w] for pin in self.pins)])

    def accepted(self, w: int, job_id: int) -> None:
        self.failures[w] = 0
        self.state_job[w] = job_id

    def failed(self, w: int) -> bool:
        """Count a lost job of ``w``; True if that retires it."""
        self.failures[w] += 1
        self.blocked = True  # the strategy may now want jobs from anyone (a new round)
        if self.failures[w] >= self.cfg.reliability.max_failures:
            self.retired.add(w)
            return True
        return False

    def everyone_retired(self) -> bool:
        return len(self.retired) == self.num_workers

    def release(self, w: int, index: int, now: float) -> float | None:
        """``w``'s ``index``-th job is over: it is free now, or (an injected fault)
        offline until the time returned."""
        if faults.goes_offline(self.cfg, w, index):
            until = now + self.cfg.faults.offline_seconds
            self.offline[w] = (now, until)
            return until
        self.free_since[w] = now
        self.newly_free.append(w)
        return None

    def away(self, w: int, since: float, until: float) -> None:
        """Free or busy worker ``w`` is absent from ``since`` until ``until``."""
        self.free_since.pop(w, None)
        self.not_drawn.discard(w)
        self.offline[w] = (since, until)
        self.absent.add(w)

    def back_online(self, w: int, now: float) -> tuple[float, bool]:
        """``w`` is free again; returns since when it was offline, and whether it was
        absent (rather than offline after a fault)."""
        since, _ = self.offline.pop(w)
        absent = w in self.absent
        self.absent.discard(w)
        self.free_since[w] = now
        self.newly_free.append(w)
        return since, absent

    def due_online(self, now: float) -> list[int]:
        return [w for w, (_, until) in self.offline.items() if until <= now]

    def pin(self, keep: int) -> None:
        """A checkpoint is written: keep the states it would resume from."""
        self.pins = [*self.pins, list(self.state_job)][-keep:]

    def closing_rows(self, end: float, version: int) -> list:
        """At the end: free workers were idle (or not drawn) until ``end``, offline ones
        offline."""
        rows = [(w, self.free_kind(w), t, end, version, None)
                for w, t in sorted(self.free_since.items())]
        return rows + [(w, IntervalKind.ABSENT if w in self.absent else IntervalKind.OFFLINE,
                        since, end, version, None)
                       for w, (since, _) in sorted(self.offline.items()) if end > since]

    def state_dict(self) -> dict:
        return {"free_since": dict(self.free_since), "offline": dict(self.offline),
                "retired": sorted(self.retired), "failures": list(self.failures),
                "jobs_of": list(self.jobs_of), "state_job": list(self.state_job),
                "pins": [list(p) for p in self.pins], "newly_free": list(self.newly_free),
                "absent": sorted(self.absent), "not_drawn": sorted(self.not_drawn),
                "scanned_version": self.scanned_version, "blocked": self.blocked,
                "sampler": self.sampler.bit_generator.state}

    def load_state_dict(self, st: dict) -> None:
        self.free_since = dict(st["free_since"])
        self.offline = dict(st["offline"])
        self.retired = set(st["retired"])
        self.failures = list(st["failures"])
        self.jobs_of = list(st["jobs_of"])
        self.state_job = list(st["state_job"])
        self.pins = [list(p) for p in st["pins"]]
        self.newly_free = list(st["newly_free"])
        self.scanned_version = st["scanned_version"]
        self.blocked = st["blocked"]
        self.absent = set(st.get("absent", []))  # a checkpoint from before absences
        self.not_drawn = set(st.get("not_drawn", []))  # ... or before not drawn: idle
        self.sampler.bit_generator.state = st["sampler"]
