"""Data shards decoupled from workers, per-shard and global inner schedules, and a
pretrained start (issue: faithful asynchronous Local-SGD)."""

import sqlite3
from collections import Counter

import numpy as np
import pytest

from fedlm import checkpoint, model as M, start
from fedlm.sim import fleet
from fedlm.config_load import from_dict
from fedlm.errors import ConfigError
from fedlm.params import params_hash
from fedlm.model import snapshot
from fedlm.replay import replay
from fedlm.runner import run_inprocess
from fedlm.shards import ShardBook, paper_weights
from fedlm.worker.train import JobSpec, run_job
from tests.conftest import tiny_config

PAPER = ["data.partition=iid", "data.shards=5", "data.shard_choice=paper",
         "inner.schedule=shard", "fleet.step_times=[1.0, 2.0, 6.0]", "fleet.jitter=0.2",
         "strategy=delayed-nesterov", "local_steps=dylu", "updates=8"]


def test_paper_rule_in_closed_form():
    # shares |D_i|/Σ|D| = .25 .25 .5; consumed n_i/Σn = .5 .1 .4 -> deficits 0 .15 .1
    p = paper_weights([100, 100, 200], [50, 10, 40])
    assert np.allclose(p, [0.0, 0.6, 0.4])
    assert np.allclose(paper_weights([100, 300], [0, 0]), [0.25, 0.75])  # nothing consumed yet
    assert np.allclose(paper_weights([100, 300], [10, 30]), [0.25, 0.75])  # none under-sampled


def test_shard_choice_draws_the_under_sampled_shards_in_proportion():
    book = ShardBook([100, 100, 200], "paper", seed=0)
    book.consumed = [50, 10, 40]
    draws = Counter()
    for _ in range(4000):  # the state does not move: pick() alone does not consume
        draws[book.pick(worker=0)] += 1
    assert draws[0] == 0  # the over-trained shard is never chosen
    assert abs(draws[1] / 4000 - 0.6) < 0.03 and abs(draws[2] / 4000 - 0.4) < 0.03


def test_shard_choice_keeps_shards_level_however_uneven_the_workers():
    book = ShardBook([100] * 4, "paper", seed=1)
    for k in range(400):  # worker 0 asks 10 times as often as the others: it still spreads
        worker = 0 if k % 13 < 10 else 1 + k % 3
        shard = book.pick(worker)
        book.take(shard, steps=5, sequences=20)
    assert max(book.steps) - min(book.steps) <= 3 * 5  # within a few jobs of each other
    fixed = ShardBook([100] * 4, "fixed", seed=1)
    assert [fixed.pick(w) for w in range(4)] == [0, 1, 2, 3]


def test_take_returns_the_shards_and_the_runs_position_before_the_job():
    book = ShardBook([10, 10], "paper", seed=0)
    assert book.take(1, 5, 20) == (0, 0)
    assert book.take(0, 3, 12) == (0, 5)
    assert book.take(1, 5, 20) == (5, 8)
    assert book.steps == [3, 10] and book.consumed == [12, 40]


def _grad_hash(cfg, job, state):
    theta = snapshot(M.build(cfg.model, cfg.data.seq_len, seed=0))
    return params_hash(run_job(theta, state, job, cfg).result.outer_grad)


@pytest.mark.parametrize("schedule", ["shard", "global"])
def test_a_shards_schedule_is_the_same_whichever_worker_trains_it(schedule):
    cfg = tiny_config("data.partition=iid", "data.shards=4", "data.shard_choice=paper",
                      f"inner.schedule={schedule}", "inner.warmup_steps=2")
    # Workers 0 and 1, one fresh, one with 40 inner steps of its own behind it, train
    # shard 2 at schedule position 6: same data seed, so the same steps at the same lrs.
    fresh, veteran = {}, {"schedule_step": 40}
    job = JobSpec(0, worker=0, base_version=0, local_steps=3, data_seed=5, shard=2,
                  cursor=6, schedule_step=6)
    other = JobSpec(0, worker=1, base_version=0, local_steps=3, data_seed=5, shard=2,
                    cursor=6, schedule_step=6)
    assert _grad_hash(cfg, job, fresh) == _grad_hash(cfg, other, veteran)
    # Another position on the schedule is another learning rate: the test can fail.
    later = JobSpec(0, 0, 0, 3, 5, shard=2, cursor=6, schedule_step=30)
    assert _grad_hash(cfg, later, fresh) != _grad_hash(cfg, job, fresh)
    # The worker schedule does follow the worker's own steps.
    own = tiny_config("data.partition=iid", "data.shards=4", "data.shard_choice=paper",
                      "inner.schedule=worker", "inner.warmup_steps=2")
    mine = JobSpec(0, 0, 0, 3, 5, shard=2)
    assert _grad_hash(own, mine, fresh) != _grad_hash(own, mine, veteran)


def test_jobs_record_shard_and_cursor_and_every_shard_schedule_is_its_own(tmp_path):
    cfg = tiny_config(*PAPER)
    run_id = run_inprocess(cfg, str(tmp_path / "r.db"))
    with sqlite3.connect(tmp_path / "r.db") as conn:
        rows = conn.execute("SELECT worker, shard, cursor, schedule_step, local_steps FROM jobs"
                            " WHERE run_id=? ORDER BY dispatch_op", (run_id,)).fetchall()
    done: dict[int, int] = {}
    workers_of: dict[int, set] = {}
    for worker, shard, cursor, schedule_step, steps in rows:
        assert cursor == done.get(shard, 0) == schedule_step  # the shard's own position
        done[shard] = cursor + steps
        workers_of.setdefault(shard, set()).add(worker)
    assert len(done) == 5  # every shard trained
    assert any(len(w) > 1 for w in workers_of.values())  # shards change hands


def test_global_schedule_follows_the_runs_steps(tmp_path):
    cfg = tiny_config(*PAPER[:-5], "inner.schedule=global", "strategy=async-nesterov",
                      "updates=6")
    run_id = run_inprocess(cfg, str(tmp_path / "g.db"))
    with sqlite3.connect(tmp_path / "g.db") as conn:
        rows = conn.execute("SELECT schedule_step, local_steps FROM jobs WHERE run_id=?"
                            " ORDER BY dispatch_op", (run_id,)).fetchall()
    assert [r[0] for r in rows] == list(np.cumsum([0] + [r[1] for r in rows[:-1]]))


def test_run_with_shard_choice_and_pretraining_replays_exactly(tmp_path):
    cfg = tiny_config(*PAPER, "init.pretrain_steps=12")
    db = tmp_path / "p.db"
    run_id = run_inprocess(cfg, str(db))
    with sqlite3.connect(db) as conn:
        initial, begin = conn.execute("SELECT initial_hash, start_hash FROM runs").fetchone()
        kinds = [k for (k,) in conn.execute("SELECT kind FROM events")]
    assert initial != begin and "pretrained" in kinds
    result = replay(db, run_id)
    assert result.identical and result.mismatched_updates == 0


def test_pretraining_is_cached_and_the_cache_is_keyed(tmp_path):
    cfg = tiny_config("init.pretrain_steps=6")
    a = start.starting_point(cfg, tmp_path / "x.db")
    b = start.starting_point(cfg, tmp_path / "x.db")  # from the cache
    c = start.starting_point(cfg, tmp_path / "x.db", use_cache=False)
    assert "(cached" in dict(b.notes)["pretrained"]
    assert "(computed" in dict(c.notes)["pretrained"]
    assert params_hash(a.params) == params_hash(b.params) == params_hash(c.params)
    other = start.starting_point(tiny_config("init.pretrain_steps=6", "inner.lr=1e-3"),
                                 tmp_path / "x.db")
    assert params_hash(other.params) != params_hash(a.params)
    assert params_hash(a.params) != params_hash(start.initial(cfg))


def test_init_from_a_run_starts_from_its_final_weights(tmp_path):
    db = tmp_path / "r.db"
    first = run_inprocess(tiny_config(), str(db))
    second = run_inprocess(tiny_config(f"init.from={first}", "seed=1"), str(db))
    other_db = tmp_path / "other.db"
    third = run_inprocess(tiny_config(f"init.from={db}:{first}"), str(other_db))
    with sqlite3.connect(db) as conn:
        final = conn.execute("SELECT final_hash FROM runs WHERE id=?", (first,)).fetchone()[0]
        begin = conn.execute("SELECT start_hash FROM runs WHERE id=?", (second,)).fetchone()[0]
    with sqlite3.connect(other_db) as conn:
        assert conn.execute("SELECT start_hash FROM runs WHERE id=?", (third,)).fetchone()[0] \
            == final
    assert begin == final
    assert replay(db, second).identical
    # a weights file works the same way
    fourth = run_inprocess(tiny_config(f"init.from={checkpoint.weights_for(db, first)}"),
                           str(other_db))
    assert replay(other_db, fourth).identical


@pytest.mark.parametrize("ref,message", [
    ("7", "there is no run 7"),
    ("missing.db:1", "cannot read"),
    ("no/such/file.pt", "no run id, DB:RUN_ID or file"),
])
def test_init_from_refuses_what_it_cannot_use_before_the_run_is_stored(tmp_path, ref, message):
    db = tmp_path / "r.db"
    run_inprocess(tiny_config(), str(db))
    with pytest.raises(ConfigError, match=message):
        run_inprocess(tiny_config(f"init.from={ref}"), str(db))
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1


def test_init_from_a_run_of_another_model_is_refused(tmp_path):
    db = tmp_path / "r.db"
    first = run_inprocess(tiny_config(), str(db))
    with pytest.raises(ConfigError, match="do not fit the 'small' model"):
        run_inprocess(tiny_config(f"init.from={first}", "model=small"), str(db))


def test_config_checks_and_the_from_spelling():
    with pytest.raises(ConfigError, match="data.shards: must be 0 or the number of workers"):
        tiny_config("data.shards=5")
    with pytest.raises(ConfigError, match="inner.schedule: must be worker, shard or global"):
        tiny_config("inner.schedule=round")
    with pytest.raises(ConfigError, match="data.shard_choice"):
        tiny_config("data.shard_choice=random")
    with pytest.raises(ConfigError, match="data.shards: must be at most 38"):
        tiny_config("data.shards=40", "data.shard_choice=paper", "data.partition=by-play")
    cfg = tiny_config("init.from=3", "data.shards=8", "data.shard_choice=paper")
    assert cfg.init.from_ == "3" and '"from": "3"' in cfg.to_json()
    assert from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="init.from_: unknown key"):
        tiny_config("init.from_=3")


def test_schedule_horizons():
    base = ["local_step_budget=1200", "workers=4", "data.partition=iid"]
    assert tiny_config(*base).schedule_horizon(nodes=4) == 300  # a worker's share
    assert tiny_config(*base, "inner.schedule=global").schedule_horizon(nodes=4) == 1200
    assert tiny_config(*base, "inner.schedule=shard", "data.shards=6",
                       "data.shard_choice=paper").schedule_horizon(nodes=4) == 200
    assert tiny_config(*base, "inner.schedule=shard", "inner.decay_steps=90") \
        .schedule_horizon(nodes=4) == 90


def test_without_a_budget_the_global_horizon_counts_a_pod_once():
    # hierarchical: a region's pod runs H steps per round, however many workers it has
    cfg = tiny_config("workers=3", "updates=5", "inner.steps=4", "inner.schedule=global",
                      "network.hierarchical=true", "fleet.topology={us = 2, eu = 1}",
                      "data.partition=iid")
    assert fleet.node_count(cfg) == 2
    assert cfg.schedule_horizon(fleet.node_count(cfg)) == 5 * 4 * 2
    assert fleet.node_count(tiny_config("workers=3")) == 3


def test_with_fixed_shards_the_shard_schedule_is_the_worker_schedule(tmp_path):
    # One shard per worker: a shard's steps are its worker's steps, and the horizons
    # agree (budget / shards = budget / workers), so the weights are the same.
    base = ["strategy=async-nesterov", "fleet.step_times=[1.0, 3.0, 5.0]",
            "local_step_budget=36", "updates=1000"]
    a = run_inprocess(tiny_config(*base), str(tmp_path / "a.db"))
    b = run_inprocess(tiny_config(*base, "inner.schedule=shard"), str(tmp_path / "b.db"))
    with sqlite3.connect(tmp_path / "a.db") as ca, sqlite3.connect(tmp_path / "b.db") as cb:
        assert ca.execute("SELECT final_hash FROM runs WHERE id=?", (a,)).fetchone() == \
            cb.execute("SELECT final_hash FROM runs WHERE id=?", (b,)).fetchone()


def test_the_dashboard_shows_what_each_job_and_shard_trained(tmp_path):
    from fedlm.dashboard import queries

    db = tmp_path / "d.db"
    run_id = run_inprocess(tiny_config(*PAPER), str(db))
    per_shard = queries.shards(db, run_id)
    assert list(per_shard["shard"]) == [0, 1, 2, 3, 4]
    with sqlite3.connect(db) as conn:
        steps = conn.execute("SELECT SUM(local_steps) FROM jobs WHERE run_id=? AND"
                             " status='done'", (run_id,)).fetchone()[0]
    assert per_shard["steps"].sum() == steps
    assert (per_shard["cursor"] >= per_shard["steps"]).all()
    spans = queries.recent_intervals(db, run_id, window=1e9)
    computed = spans[spans["kind"] == "compute"]
    assert computed["shard"].notna().all() and {"shard", "cursor"} <= set(spans.columns)
