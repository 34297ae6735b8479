"""Injected faults: each is logged, bad updates never applied, training goes on."""

import sqlite3

import pytest

from fedlm import servers
from fedlm.sim import faults
from fedlm.config import FAULT_KINDS
from fedlm.replay import replay
from fedlm.runner import run_inprocess
from tests.conftest import tiny_config
from tests.support import run_engine

ASYNC = ["strategy=async-sgd", "updates=8", "reliability.checkpoint_every=0"]
# What each fault must lead to: the lost job's reason and words of its job_failed event.
OUTCOME = {"crash": ("error", "injected crash"), "hang": ("deadline", "deadline"),
           "nan": ("rejected", "NaN or Inf"), "bad_shape": ("rejected", "shape"),
           "bad_dtype": ("rejected", "dtype"), "bad_size": ("rejected", "missing")}


def _rows(db, sql):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_draws_are_seeded_per_worker_and_job():
    cfg = tiny_config("faults.crash=0.2", "faults.nan=0.2", "faults.workers=[1]")
    draws = [[faults.draw(cfg, w, k) for k in range(200)] for w in range(3)]
    assert draws == [[faults.draw(cfg, w, k) for k in range(200)] for w in range(3)]
    assert set(draws[0]) == set(draws[2]) == {""}  # only worker 1 is faulty
    assert 20 < draws[1].count("crash") < 60 and 20 < draws[1].count("nan") < 60


@pytest.mark.parametrize("kind", sorted(OUTCOME))
def test_fault_is_logged_refused_and_training_goes_on(tmp_path, kind):
    db = tmp_path / "f.db"
    run_id = run_inprocess(tiny_config(*ASYNC, f"faults.{kind}=0.3"), str(db))
    assert _rows(db, "SELECT status, updates FROM runs") == [("finished", 8)]
    injected = _rows(db, "SELECT job_id FROM events WHERE kind='fault_injected'"
                         f" AND detail='{kind}'")
    assert injected, "the seed drew no fault: raise the probability"
    reason, words = OUTCOME[kind]
    # (a job still out when the run ends is cancelled, not lost: its deadline never came)
    settled = [j for (j,) in injected
               if _rows(db, f"SELECT status FROM jobs WHERE job_id={j}") != [("cancelled",)]]
    assert settled
    for job_id in settled:
        assert _rows(db, f"SELECT status, reason FROM jobs WHERE job_id={job_id}") == [
            ("lost", reason)]
        (detail,) = _rows(db, f"SELECT detail FROM events WHERE kind='job_failed'"
                              f" AND job_id={job_id}")[0]
        assert words in detail
        assert not _rows(db, f"SELECT 1 FROM updates WHERE job_id={job_id}")  # never applied
    if kind == "hang":  # what the hung job sent after its deadline was ignored
        assert _rows(db, "SELECT COUNT(*) FROM events WHERE kind='late_reply'")[0][0] >= 1
    assert replay(db, run_id).identical


def test_duplicate_replies_are_ignored(tmp_path):
    clean = run_engine(tiny_config(*ASYNC), tmp_path / "a.db")[1]
    db = tmp_path / "dup.db"
    engine, dup, _ = run_engine(tiny_config(*ASYNC, "faults.duplicate=0.5"), db)
    assert _rows(db, "SELECT COUNT(*) FROM events WHERE kind='duplicate_reply'")[0][0] >= 2
    assert _rows(db, "SELECT COUNT(*) FROM updates")[0][0] == engine.jobs_done
    assert all(dup[k].equal(clean[k]) for k in clean)  # as if nothing had been duplicated


def test_offline_workers_get_no_jobs_until_they_are_back(tmp_path):
    db = tmp_path / "off.db"
    run_inprocess(tiny_config(*ASYNC, "updates=12", "faults.offline=0.4",
                              "faults.offline_seconds=25"), str(db))
    spans = _rows(db, "SELECT worker, t_start, t_end FROM intervals WHERE kind='offline'")
    assert spans
    # (one going offline at the very end leaves an empty span, which is not stored)
    assert _rows(db, "SELECT COUNT(*) FROM events WHERE kind='worker_offline'")[0][0] >= len(spans)
    for w, a, b in spans:
        assert not _rows(db, f"SELECT job_id FROM jobs WHERE worker={w}"
                             f" AND t_dispatch > {a} AND t_dispatch < {b}")


def test_sync_round_closes_with_what_arrived_by_the_deadline(tmp_path):
    # Worker 2 always hangs: each round closes at the deadline with workers 0 and 1,
    # and after three misses in a row worker 2 is retired.
    cfg = tiny_config("strategy=diloco", "updates=5", "faults.hang=1.0", "faults.workers=[2]",
                      "reliability.checkpoint_every=0")
    db = tmp_path / "s.db"
    engine, _, run_id = run_engine(cfg, db)
    assert engine.version == 5 and engine.pool.retired == {2}
    assert _rows(db, "SELECT COUNT(*) FROM events WHERE kind='round_closed'")[0][0] == 3
    per_version = _rows(db, "SELECT applied_version, COUNT(*) FROM updates"
                            " GROUP BY applied_version")
    assert per_version == [(v, 2) for v in range(1, 6)]
    assert replay(db, run_id).identical


def test_sync_round_with_too_few_replies_starts_over(tmp_path):
    cfg = tiny_config("strategy=diloco", "updates=2", "faults.hang=1.0", "faults.workers=[2]",
                      "outer.min_replies=3", "reliability.checkpoint_every=0")
    server = servers.build(cfg)
    engine, _, run_id = run_engine(cfg, tmp_path / "m.db", server=server)
    # Three rounds fail (2 of 3 replies; the third miss also retires worker 2);
    # then the fleet has two workers and rounds of two close at the barrier.
    assert server.strategy.rounds.failed_rounds == 3 and engine.version == 2
    assert replay(tmp_path / "m.db", run_id).identical


def test_every_kind_is_known_to_the_config():
    assert set(OUTCOME) | {"duplicate"} == set(FAULT_KINDS)
