"""The grace period, the fourth piece of the delayed-Nesterov paper's framework.

With c = 0, N pushes of delayed Nesterov add up to one Nesterov step on their mean.
So on equally fast workers, a grace period wide enough to catch a whole cycle of
arrivals makes every worker restart from the post-momentum model, and DN computes
what synchronous DiLoCo computes (up to float rounding). Without it the first
finishers restart before the cycle's momentum step and the runs part ways.
"""

import torch

from fedlm import checkpoint
from fedlm.runner import run_inprocess
from tests.conftest import tiny_config

# Homogeneous workers whose jobs finish within ±10% of each other (5 s jobs).
SAME_SPEED = ["workers=4", "profile=homogeneous", "fleet.jitter=0.05", "inner.steps=5",
              "outer.lr=0.7", "outer.momentum=0.9", "seed=3", "data.partition=iid"]


def _final(tmp_path, name, *overrides):
    db = tmp_path / f"{name}.db"
    run_id = run_inprocess(tiny_config(*SAME_SPEED, *overrides), str(db))
    return checkpoint.read(checkpoint.weights_for(db, run_id))["params"]


def _largest_difference(a, b) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_delayed_nesterov_with_a_wide_grace_period_is_sync_diloco(tmp_path):
    sync = _final(tmp_path, "sync", "strategy=diloco", "updates=4")
    # 4 sync rounds = 16 async pushes = 4 delayed momentum steps
    dn = _final(tmp_path, "dn", "strategy=delayed-nesterov", "updates=16", "grace=2")
    for name in sync:
        torch.testing.assert_close(dn[name], sync[name], rtol=1e-4, atol=1e-5)
    no_grace = _final(tmp_path, "nograce", "strategy=delayed-nesterov", "updates=16",
                      "grace=off")
    assert _largest_difference(no_grace, sync) > 100 * _largest_difference(dn, sync)
    # the default for delayed Nesterov, the adaptive window, groups them the same way
    auto = _final(tmp_path, "auto", "strategy=delayed-nesterov", "updates=16")
    for name in sync:
        torch.testing.assert_close(auto[name], sync[name], rtol=1e-4, atol=1e-5)


def test_grace_does_not_change_a_synchronous_run(tmp_path):
    a = _final(tmp_path, "a", "strategy=diloco", "updates=3")
    b = _final(tmp_path, "b", "strategy=diloco", "updates=3", "grace=2")
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- the adaptive window, on the virtual clock (timing only: zero updates) ---------------

import sqlite3  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import pytest  # noqa: E402

from fedlm import model as M  # noqa: E402
from fedlm.engine import JobResult  # noqa: E402
from fedlm.engine.grace import AdaptiveGrace, FixedGrace, NoGrace, grace_rule  # noqa: E402
from fedlm.engine.in_flight import InFlightJobs  # noqa: E402
from fedlm.engine.types import InFlight  # noqa: E402
from fedlm.model import snapshot  # noqa: E402
from fedlm.engine.dry_run import InstantTransport  # noqa: E402
from fedlm.job import JobSpec  # noqa: E402
from tests.support import run_engine  # noqa: E402

# Four workers, H = 20, no jitter: three take 20 s a job, the last 24.9 s, the shape
# of the job that broke the fixed 4 s window (22 s under jitter, 4.9 s after the first).
# (`adaptive`: with fixed H on uneven workers `auto` opens no window.)
LATE = ["workers=4", "inner.steps=20", "fleet.step_times=[1.0, 1.0, 1.0, 1.245]",
        "fleet.jitter=0.0", "strategy=delayed-nesterov", "updates=40", "grace=adaptive"]


def _timing_run(tmp_path, *overrides):
    """A run whose jobs take no real compute (zero updates): only the clock matters.
    Returns the dispatch passes: {dispatch time: workers given a job then}."""
    cfg = tiny_config(*LATE, *overrides)
    theta = snapshot(M.build(cfg.model, cfg.data.seq_len, seed=cfg.seed))
    db = tmp_path / f"t{len(list(tmp_path.iterdir()))}.db"
    run_engine(cfg, db, InstantTransport(theta, cfg), evaluate=False)
    conn = sqlite3.connect(db)
    passes: dict[float, set[int]] = {}
    for t, w in conn.execute("SELECT t_dispatch, worker FROM jobs ORDER BY dispatch_op"):
        passes.setdefault(t, set()).add(w)
    events = conn.execute("SELECT kind, detail FROM events").fetchall()
    conn.close()
    return list(passes.values()), events


def test_a_late_job_outside_a_fixed_window_splits_the_fleet(tmp_path):
    passes, _ = _timing_run(tmp_path, "grace=4")
    assert passes[0] == {0, 1, 2, 3}
    # the late worker drifts 4.9 s a job: together again only when it laps the others
    full = sum(p == {0, 1, 2, 3} for p in passes)
    assert full < len(passes) / 4


def test_the_adaptive_window_waits_for_the_late_job_and_keeps_the_fleet_together(tmp_path):
    passes, events = _timing_run(tmp_path)
    assert all(p == {0, 1, 2, 3} for p in passes)
    assert not [e for e in events if e[0] == "grace_timeout"]


def test_a_worker_that_stops_answering_holds_the_others_up_by_at_most_the_span(tmp_path):
    # worker 3 hangs on every job: each window gives up on it after half a job
    passes, events = _timing_run(tmp_path, "faults.hang=1.0", "faults.workers=[3]",
                                 "reliability.max_failures=100")
    timeouts = [d for k, d in events if k == "grace_timeout"]
    assert timeouts
    waited = [float(d.split()[1]) for d in timeouts]
    assert max(waited) <= 0.5 * 20.01  # span x the first finisher's job (20 s + transfers)
    assert sum(1 for p in passes if {0, 1, 2} <= p) >= len(passes) // 2


def _flight(job_id, worker, t_dispatch, version=0, steps=10):
    return InFlight(JobSpec(job_id, worker, version, steps, 0), t_dispatch, None, 0, 1e9)


def _dispatch(g, *flights):
    """The jobs in flight, dispatched as the engine does: the rule hears of each."""
    jobs = InFlightJobs()
    for f in flights:
        jobs.add(f)
        g.dispatched(f)
    return jobs


def test_adaptive_window_rule():
    g = AdaptiveGrace(span=0.5, num_workers=3)
    # no pace known: the first finisher's cohort (same moment, same model) is expected
    flights = _dispatch(g, _flight(1, 1, 0.0), _flight(2, 2, 5.0, version=1))
    w = g.open(20.0, _flight(0, 0, 0.0), flights)
    assert w.expected == {1} and w.closes == pytest.approx(30.0)  # 20 + 0.5 x 20
    # with a pace (2 s a step) known when job 2 was dispatched, job 2 is expected at
    # 5 + 10 x 2 = 25 <= 30: it joins, and the window gives it the same slack past
    # when it is expected
    g = AdaptiveGrace(span=0.5, num_workers=3)
    g.observe(_flight(9, 2, 0.0), now=20.0)
    flights = _dispatch(g, _flight(1, 1, 0.0), _flight(2, 2, 5.0, version=1))
    w = g.open(20.0, _flight(0, 0, 0.0), flights)
    assert w.expected == {1, 2} and w.closes == pytest.approx(35.0)
    assert g.open(20.0, _flight(0, 0, 0.0), flights).expected == {1, 2}  # asked again
    assert not w.complete(flights)
    flights.pop(2)
    assert not w.complete(flights)
    flights.pop(1)
    assert w.complete(flights)  # every job it waited for is in
    # a job expected long after the window is not waited for
    far = _dispatch(g, _flight(3, 2, 15.0, version=1))  # expected at 35 > 30
    assert g.open(20.0, _flight(0, 0, 0.0), far) is None


def test_grace_settings_name_their_rules():
    def rule(setting, **kw):
        return grace_rule(setting, 0.5, num_workers=2, **{
            "wants_grace": True, "synchronous": False, "together": True, **kw})
    assert isinstance(rule("auto"), AdaptiveGrace)
    assert type(rule("auto", wants_grace=False)) is NoGrace
    assert type(rule("auto", together=False)) is NoGrace  # fixed H on uneven workers
    assert isinstance(rule("adaptive", wants_grace=False), AdaptiveGrace)
    assert type(rule("off")) is NoGrace and type(rule("0")) is NoGrace
    assert isinstance(rule("4"), FixedGrace) and rule("4").seconds == 4.0
    assert type(rule("adaptive", synchronous=True)) is NoGrace  # a barrier needs none


# -- the adaptive window on the wall clock -----------------------------------------------

class PacedTransport:
    """Replies come back after a fixed real time per worker (zero updates): a real
    arrival order for the wall clock, the last worker later than the others."""

    def __init__(self, params, cfg, seconds):
        self.instant = InstantTransport(params, cfg)
        self.seconds = seconds
        self.due: list[tuple[float, JobResult]] = []
        self.cv = threading.Condition()

    def submit(self, job, params_) -> None:
        self.instant.submit(job, params_)
        reply = self.instant.collect(0.0)[0]
        self.due.append((time.monotonic() + self.seconds[job.worker], reply))

    def collect(self, timeout: float) -> list:
        now = time.monotonic()
        soonest = min((t for t, _ in self.due), default=now + timeout)
        if soonest > now:  # the earliest reply is not due yet: simulated compute
            time.sleep(min(soonest - now, timeout))
        now = time.monotonic()
        ready = [r for t, r in self.due if t <= now]
        self.due = [(t, r) for t, r in self.due if t > now]
        return ready


@pytest.mark.parametrize("grace", ["off", "adaptive"])
def test_the_adaptive_window_groups_real_arrivals_too(tmp_path, grace):
    cfg = tiny_config(*LATE, "clock=wall", "updates=12", f"grace={grace}", "grace_span=1.0")
    theta = snapshot(M.build(cfg.model, cfg.data.seq_len, seed=cfg.seed))
    transport = PacedTransport(theta, cfg, seconds=[0.4, 0.42, 0.44, 0.6])
    run_engine(cfg, tmp_path / "w.db", transport, evaluate=False)
    conn = sqlite3.connect(tmp_path / "w.db")
    sizes = Counter(t for (t,) in conn.execute("SELECT t_dispatch FROM jobs"))
    conn.close()
    if grace == "adaptive":  # every pass hands out work to all four, together
        assert set(sizes.values()) == {4}
    else:
        assert max(list(sizes.values())[1:]) == 1
