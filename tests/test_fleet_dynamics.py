"""A fleet that changes over time (fedlm.sim.dynamics, fedlm.engine.presence)."""

import json
import math
import sqlite3

import numpy as np
import pytest

from fedlm import config_load, store
from fedlm.config import FleetConfig
from fedlm.errors import ConfigError
from fedlm.replay import replay
from fedlm.runner import run_inprocess
from fedlm.sim import dynamics
from tests.conftest import tiny_config
from tests.support import run_engine


def _dyn(regions=("local",) * 3, seed=0, **fleet) -> dynamics.FleetDynamics:
    return dynamics.build(FleetConfig(**fleet), list(regions), seed)


def test_a_slowed_compute_does_its_work_at_one_over_factor_of_the_speed():
    dyn = _dyn(slowdown={"factor": 4.0, "normal": 30.0, "slow": 20.0})
    rng = np.random.default_rng(1)
    for _ in range(50):
        start, work = float(rng.uniform(0, 500)), float(rng.uniform(0.1, 200))
        end = dyn.compute_end(1, start, work)
        # the work done is the time spent, slow spans counting a quarter
        slow = sum(max(0.0, min(b, end) - max(a, start))
                   for a, b in dyn.slow_spans(1, end))
        assert (end - start) - slow + slow / 4.0 == pytest.approx(work, rel=1e-9)


def test_answers_do_not_depend_on_the_order_of_the_questions():
    kw = dict(slowdown={"factor": 3.0, "normal": 40.0, "slow": 10.0},
              availability={"up": 50.0, "down": 15.0}, stragglers={"p": 0.3})
    a, b = _dyn(**kw), _dyn(**kw)
    times = [float(t) for t in np.linspace(0, 2000, 41)]
    ask_a = [(a.absence(2, t), a.compute_end(2, t, 30.0)) for t in times]
    ask_b = [(b.absence(2, t), b.compute_end(2, t, 30.0)) for t in reversed(times)][::-1]
    assert ask_a == ask_b
    assert [a.straggle(0, k) for k in range(30)] == [b.straggle(0, k) for k in range(30)]
    assert _dyn(seed=1, **kw).absence(2, 500.0) != a.absence(2, 500.0)  # the seed matters


def test_absences_merge_join_leave_and_the_process():
    dyn = _dyn(availability={"up": 30.0, "down": 10.0, "workers": [1]},
               join=[0.0, 100.0, 0.0], leave=[0.0, 400.0, 250.0])
    assert dyn.absence(0, 0.0) is None  # always there
    assert dyn.absence(2, 0.0) == (250.0, math.inf)  # leaves at 250, never back
    spans, t = [], 0.0
    while True:
        span = dyn.absence(1, t)
        spans.append(span)
        if math.isinf(span[1]):
            break
        t = span[1]
    assert spans[0][0] == 0.0 and spans[0][1] >= 100.0  # not there before it joins
    assert all(b < c for (_, b), (c, _) in zip(spans, spans[1:]))  # disjoint, in order
    assert spans[-1][0] <= 400.0  # gone for good by its leave time
    assert dyn.departs(2, 200.0, 260.0) == 250.0 and dyn.departs(2, 200.0, 240.0) is None


def test_stragglers_are_rare_and_heavy_tailed():
    dyn = _dyn(stragglers={"p": 0.1, "factor": 5.0, "alpha": 1.5, "max": 100.0})
    draws = [dyn.straggle(0, k) for k in range(4000)]
    hits = [d.multiplier for d in draws if d is not None]
    assert 0.08 < len(hits) / len(draws) < 0.12
    assert min(hits) >= 5.0 and max(hits) <= 100.0 and max(hits) > 30.0


@pytest.mark.parametrize("sets,message", [
    (["fleet.slowdown={factor=0.5}"], "fleet.slowdown.factor: must be a factor in \\(1, "),
    (["fleet.slowdown={speed=2}"], "fleet.slowdown.speed: unknown key"),
    (["fleet.stragglers={p=2}"], "fleet.stragglers.p: must be a probability"),
    (["fleet.availability={up=-1}"], "fleet.availability.up: must be a duration in seconds"),
    (["fleet.availability={up=10, workers=[7]}"], "fleet.availability.workers: 7 is not a worker"),
    (["fleet.slowdown={regions=['asia']}"], "no worker is in region 'asia'"),
    (["fleet.join=[0, 0, 0, 5]"], "fleet.join: 4 times for 3 workers"),
    (["fleet.join=[0, 50]", "fleet.leave=[0, 20]"], "fleet.leave[1]: 20.0 is not after"),
    (["fleet.trace_time_scale=0"], "fleet.trace_time_scale"),
    (["fleet.device_trace=."], "fleet.device_trace: .: the trace is a directory"),
    (["fleet.availability_trace=/nonexistent.json"], "fleet.availability_trace: "),
    (["fleet.slowdown={factor=2}", "clock=wall"], "fleet.slowdown, fleet.stragglers: the virtual"),
    (["fleet.join=[0, 5, 0]", "network.hierarchical=true"], "one worker per node"),
])
def test_bad_settings_are_refused_in_one_line(sets, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        tiny_config(*sets)


def _lost_reasons(db, run_id):
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT reason, COUNT(*) FROM jobs WHERE run_id=? AND"
                                 " status='lost' GROUP BY reason", (run_id,)).fetchall())


def test_a_worker_that_goes_away_loses_its_job_and_comes_back_for_new_work(tmp_path):
    cfg = tiny_config("strategy=async-sgd", "updates=40", "fleet.jitter=0",
                      "fleet.availability={up=12, down=8}", "reliability.max_failures=2")
    engine, _, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    db = tmp_path / "r.db"
    assert _lost_reasons(db, run_id).get("departed", 0) >= 3  # more than max_failures
    assert not engine.pool.retired  # a departure is no failure
    changes = store.fleet_changes(db, run_id)
    assert sum(c.absences for c in changes) >= 3 and all(c.absent > 0 for c in changes)
    with sqlite3.connect(db) as conn:
        # nobody was sent work while away: every dispatch falls outside its absences
        for w, t in conn.execute("SELECT worker, t_dispatch FROM jobs WHERE run_id=?",
                                 (run_id,)):
            assert engine.presence.dynamics.absent(w, t) is None
        # an absent span ends where the worker comes back, as its event says
        back = conn.execute("SELECT COUNT(*) FROM events WHERE run_id=? AND"
                            " kind='worker_online' AND detail LIKE '%absent'",
                            (run_id,)).fetchone()[0]
    assert back >= 3


def _dispatch_span(db, run_id) -> tuple[dict, dict]:
    """Per worker, when its first and its last job were dispatched."""
    with sqlite3.connect(db) as conn:
        spans = conn.execute("SELECT worker, MIN(t_dispatch), MAX(t_dispatch) FROM jobs"
                             " WHERE run_id=? GROUP BY worker", (run_id,)).fetchall()
    return {w: a for w, a, _ in spans}, {w: b for w, _, b in spans}


def test_a_sync_round_closes_without_a_worker_that_left(tmp_path):
    cfg = tiny_config("strategy=diloco", "updates=6", "fleet.step_times=[1, 1, 1]",
                      "fleet.leave=[0, 0, 10]", "fleet.join=[0, 7, 0]")
    engine, _, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    db = tmp_path / "r.db"
    first, last = _dispatch_span(db, run_id)
    assert first[1] >= 7.0  # joined late
    assert last[2] < 10.0  # left at 10 and never came back
    assert engine.version == 6
    changes = {c.worker: c for c in store.fleet_changes(db, run_id)}
    assert changes[2].left == 10.0 and changes[1].joined == 7.0


def test_a_run_whose_fleet_has_left_ends_and_says_so(tmp_path):
    cfg = tiny_config("strategy=async-sgd", "updates=500", "fleet.leave=[30, 40, 50]")
    engine, _, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    assert engine.version < 500 and engine.now <= 50.0
    with sqlite3.connect(tmp_path / "r.db") as conn:
        kinds = {k for (k,) in conn.execute("SELECT kind FROM events WHERE run_id=?",
                                            (run_id,))}
    assert "fleet_empty" in kinds


def test_slow_downs_stretch_jobs_and_are_drawn_but_not_counted(tmp_path):
    base = ["strategy=diloco", "updates=4", "fleet.jitter=0", "reliability.deadline_factor=50"]
    steady, _, _ = run_engine(tiny_config(*base), tmp_path / "a.db", evaluate=False)
    slowed, _, run_id = run_engine(
        tiny_config(*base, "fleet.slowdown={factor=5, normal=5, slow=5}"),
        tmp_path / "b.db", evaluate=False)
    assert slowed.now > 1.2 * steady.now  # (fewer rounds than the 1.67x on average)
    s = store.summarize(tmp_path / "b.db", run_id)
    for w in s.workers:  # slowed spans overlay the others: the totals still add up
        assert w.compute + w.communication + w.idle == pytest.approx(slowed.now, rel=1e-6)
    assert all(c.slowed > 0 for c in store.fleet_changes(tmp_path / "b.db", run_id))


def _write_traces(folder):
    """A device trace and an availability trace in FedScale's format, by hand."""
    device = {"11": {"computation": 40.0, "communication": 800000.0},
              "12": {"computation": 90.0, "communication": 200000.0},
              "13": {"computation": 150.0, "communication": 100000.0}}
    behave = {"11": {"active": [0, 300], "inactive": [200, 600], "finish_time": 600,
                     "duration": 500, "model": "by hand"},
              "12": {"active": [50], "inactive": [500], "finish_time": 600},
              "13": {"active": [0, 250], "inactive": [150, 580], "finish_time": 600}}
    (folder / "device.json").write_text(json.dumps(device))
    (folder / "behave.json").write_text(json.dumps(behave))
    return [f"fleet.device_trace={folder / 'device.json'}",
            f"fleet.availability_trace={folder / 'behave.json'}",
            "fleet.trace_time_scale=0.2"]


def test_a_run_on_fedscale_traces_resumes_and_replays_bit_for_bit(tmp_path):
    from fedlm.engine import Interrupted

    sets = [*_write_traces(tmp_path), "strategy=delayed-nesterov", "local_steps=dylu",
            "updates=40", "eval.every=20", "reliability.checkpoint_every=2",
            "reliability.deadline_factor=20",
            "fleet.stragglers={p=0.2}", "fleet.slowdown={factor=3, normal=20, slow=10}"]
    cfg = tiny_config(*sets)
    profiles = __import__("fedlm.sim.fleet", fromlist=["x"]).node_profiles(cfg)
    assert [p.step_time for p in profiles] == pytest.approx(
        [3.0 * 4 * ms / 1000 for ms in (40.0, 90.0, 150.0)])  # FedScale's 3 x batch x ms
    ref_db, db = tmp_path / "ref.db", tmp_path / "stopped.db"
    run_inprocess(cfg, str(ref_db))
    assert _lost_reasons(ref_db, 1).get("departed", 0) >= 1  # the trace took workers away
    stop = []
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*sets), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= 16 else None)
    run_inprocess(tiny_config(*sets), str(db), resume=1)
    (ref,), (run,) = store.list_runs(ref_db), store.list_runs(db)
    assert (run["status"], run["final_hash"]) == ("finished", ref["final_hash"])
    assert replay(str(db), 1).identical


def test_config_round_trips_through_json():
    cfg = tiny_config("fleet.slowdown={factor=2, regions=['local']}", "fleet.join=[0, 5, 0]")
    assert config_load.from_json(cfg.to_json()) == cfg


def test_on_the_wall_clock_absences_join_and_leave_in_real_seconds(tmp_path):
    # real arrivals: a worker that joins at 0.3 s gets no job before, one that leaves at
    # 0.5 s none after (its job in flight then is lost as departed); replay is exact
    cfg = tiny_config("strategy=async-sgd", "updates=80", "clock=wall",
                      "fleet.join=[0, 0, 0.3]", "fleet.leave=[0, 0.5, 0]")
    engine, _, run_id = run_engine(cfg, tmp_path / "w.db", evaluate=False)
    db = tmp_path / "w.db"
    first, last = _dispatch_span(db, run_id)
    assert engine.version == 80 and engine.now > 0.7  # (80 jobs take longer than that)
    assert first[2] >= 0.3 and last[1] < 0.5
    changes = {c.worker: c for c in store.fleet_changes(db, run_id)}
    assert 0.5 <= changes[1].left < engine.now  # noticed at the engine's next look
    assert replay(str(db), run_id).identical


def test_one_idle_fraction_everywhere_once_workers_are_absent(tmp_path):
    """fedlm show (per worker and overall) and the dashboard (headline and per-worker
    table) give the same idle fractions: idle over time present (absent time is no one's
    idle time; docs/fleets_over_time.md)."""
    import sqlite3

    from dashboard import queries
    from fedlm.runner import run_inprocess
    from fedlm.store import summarize

    db = tmp_path / "r.db"
    run_inprocess(tiny_config("fleet.preset=very", "inner.steps=3", "updates=6",
                              "fleet.join=[0, 0, 30]", "fleet.leave=[0, 60, 0]"), str(db))
    rows = sqlite3.connect(db).execute(
        "SELECT worker, kind, SUM(t_end - t_start) FROM intervals GROUP BY worker, kind").fetchall()
    spans: dict = {}
    for w, kind, seconds in rows:
        spans.setdefault(w, {})[kind] = seconds
    assert spans[2].get("absent", 0) > 0 and spans[1].get("absent", 0) > 0
    present = {w: sum(v for k, v in s.items() if k not in ("absent", "offline", "slowed",
                                                          "hidden exchange"))
               for w, s in spans.items()}
    by_hand = {w: spans[w].get("idle", 0.0) / present[w] for w in spans}
    overall = sum(s.get("idle", 0.0) for s in spans.values()) / sum(present.values())
    summary = summarize(db, 1)
    shown = {w.worker: w.idle_fraction for w in summary.workers}
    table = queries.worker_totals(db, 1).set_index("worker")["idle_fraction"].to_dict()
    for w in spans:
        assert shown[w] == pytest.approx(by_hand[w]) == pytest.approx(table[w])
    assert summary.idle_fraction == pytest.approx(overall)
    assert queries.headline(db, 1)["idle_fraction"] == pytest.approx(overall)
