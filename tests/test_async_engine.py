"""Async scheduling in the engine: no barrier, staleness, grace period, DyLU."""

import sqlite3

import pytest

from fedlm import store
from tests.conftest import tiny_config
from tests.support import run_engine

HETERO = ["fleet.step_times=[1.0, 2.0, 4.0]", "fleet.jitter=0.0"]


def test_async_workers_are_not_idle_while_sync_ones_wait(tmp_path):
    db = tmp_path / "r.db"
    _, _, sync_id = run_engine(tiny_config(*HETERO, "strategy=diloco", "updates=3"), db,
                               evaluate=False)
    _, _, async_id = run_engine(tiny_config(*HETERO, "strategy=async-sgd", "updates=9"), db,
                                evaluate=False)
    sync, asyn = store.summarize(db, sync_id), store.summarize(db, async_id)
    assert sync.workers[0].idle_fraction > 0.5  # 4x faster than the slowest
    assert all(w.idle_fraction < 1e-9 for w in asyn.workers)
    # fast workers did more jobs than the slow one
    assert asyn.workers[0].jobs > asyn.workers[2].jobs


def test_staleness_is_version_at_apply_minus_base_version(tmp_path):
    cfg = tiny_config(*HETERO, "strategy=async-nesterov", "updates=8")
    _, _, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    conn = sqlite3.connect(tmp_path / "r.db")
    rows = conn.execute("SELECT worker, base_version, received_version, staleness,"
                        " applied_version FROM updates ORDER BY seq").fetchall()
    assert all(s == recv - base for _, base, recv, s, _ in rows)
    assert all(applied == recv + 1 for *_, recv, s, applied in
               [(r[0], r[1], r[2], r[3], r[4]) for r in rows])
    slow = [s for w, _, _, s, _ in rows if w == 2]
    assert max(slow) >= 2  # the slow worker's updates are stale


def test_grace_period_restarts_close_finishers_from_the_same_model(tmp_path):
    # workers 0 and 1 finish 0.1 s apart each time; a grace of 0.5 s groups them
    steps = ["fleet.step_times=[1.0, 1.02, 3.0]", "fleet.jitter=0.0", "inner.steps=5",
             "strategy=async-sgd", "updates=6"]
    conn_of = {}
    for grace in (0.0, 0.5):
        db = tmp_path / f"g{grace}.db"
        run_engine(tiny_config(*steps, f"grace={grace}"), db, evaluate=False)
        conn_of[grace] = sqlite3.connect(db)
    pairs = {}
    for grace, conn in conn_of.items():
        jobs = conn.execute("SELECT worker, base_version FROM jobs WHERE worker < 2"
                            " ORDER BY job_id").fetchall()
        second = [[b for w, b in jobs if w == k][1] for k in (0, 1)]
        pairs[grace] = second
    assert pairs[0.0][0] != pairs[0.0][1]  # without grace they restart from different models
    assert pairs[0.5][0] == pairs[0.5][1]  # with grace, from the same one


def test_dylu_gives_slow_workers_fewer_steps_and_evens_job_times(tmp_path):
    cfg = tiny_config(*HETERO, "strategy=delayed-nesterov", "local_steps=dylu",
                      "inner.steps=8", "updates=9")
    _, _, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    conn = sqlite3.connect(tmp_path / "r.db")
    steps = dict(conn.execute("SELECT worker, MAX(local_steps) FROM jobs GROUP BY worker"))
    assert steps == {0: 8, 1: 4, 2: 2}
    compute = conn.execute("SELECT worker, AVG(t_end - t_start) FROM intervals"
                           " WHERE kind='compute' GROUP BY worker").fetchall()
    spans = [c for _, c in compute]
    assert max(spans) / min(spans) == pytest.approx(1.0)


@pytest.mark.parametrize("strategy", ["async-sgd", "fedavg"])
def test_concurrency_cap_bounds_jobs_in_flight_and_samples_workers(tmp_path, strategy):
    cfg = tiny_config("workers=6", "max_in_flight=2", f"strategy={strategy}", "updates=8",
                      "fleet.jitter=0.0")
    engine, _, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    conn = sqlite3.connect(tmp_path / "r.db")
    spans = conn.execute("SELECT j.t_dispatch, u.t_done, j.worker FROM jobs j JOIN updates u"
                         " ON u.job_id = j.job_id").fetchall()
    events = sorted([(t0, 1) for t0, _, _ in spans] + [(t1, -1) for _, t1, _ in spans],
                    key=lambda e: (e[0], e[1]))  # a finish frees its slot before a dispatch
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2
    assert len({w for *_, w in spans}) > 2  # sampled across the fleet, not just workers 0-1


# -- the local-step budget ------------------------------------------------------------

def _budget_run(tmp_path, *overrides):
    """A timing-only run (zero updates) under a local-step budget: the jobs table."""
    from fedlm import model as M
    from fedlm.model import snapshot
    from fedlm.engine.dry_run import InstantTransport

    cfg = tiny_config("updates=100000", "fleet.jitter=0.05", *overrides)
    theta = snapshot(M.build(cfg.model, cfg.data.seq_len, seed=cfg.seed))
    engine, _, _ = run_engine(cfg, tmp_path / "b.db", InstantTransport(theta, cfg),
                              evaluate=False)
    conn = sqlite3.connect(tmp_path / "b.db")
    jobs = conn.execute("SELECT status, local_steps FROM jobs").fetchall()
    conn.close()
    return engine, jobs


@pytest.mark.parametrize("strategy", ["delayed-nesterov", "async-sgd"])
def test_an_async_budget_ends_on_exactly_the_budget_with_nothing_in_flight(tmp_path, strategy):
    # DyLU on very: jobs of 20/9/4/2 steps; 1,001 is no sum of whole jobs
    engine, jobs = _budget_run(tmp_path, "workers=4", "profile=very", "inner.steps=20",
                               "local_steps=dylu", f"strategy={strategy}",
                               "local_step_budget=1001")
    assert engine.steps_done == 1001 == sum(s for _, s in jobs)
    assert {status for status, _ in jobs} == {"done"}  # every job handed out was applied


def test_a_sync_budget_ends_on_a_whole_round(tmp_path):
    # 8 workers x 5 steps = 40 a round: 100 steps end after the third round (120)
    engine, jobs = _budget_run(tmp_path, "workers=8", "inner.steps=5", "strategy=diloco",
                               "local_step_budget=100")
    assert engine.version == 3 and engine.steps_done == 120
    assert len(jobs) == 24 and {status for status, _ in jobs} == {"done"}
