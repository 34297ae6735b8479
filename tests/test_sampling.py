"""Client sampling for synchronous rounds (strategies/sampling.py, FedAvg's ``fraction``,
``min_workers``, ``sample_by``, ``overcommit``): K of the N available a round, drawn from
the run's seed; ceil(K x c) dispatched, the first K kept, the rest dropped (never applied);
a round deadline; the draw logged and made again by replay and resume, bit for bit."""

import json
import sqlite3

import pytest

from fedlm.replay import replay
from fedlm.runner import run_inprocess
from fedlm.strategies.sampling import Sampling
from tests.conftest import tiny_config
from tests.support import trains_replays_and_resumes

SAMPLED = ("strategy=diloco", "workers=10", "outer.fraction=0.3", "outer.overcommit=1.3",
           "profile=very", "updates=4")


@pytest.mark.parametrize("fraction, minimum, overcommit, available, want", [
    (0.3, 1, 1.0, 10, (3, 3)),  # floor(0.3 x 10), as Flower's fraction_train
    (0.3, 1, 1.3, 10, (3, 4)),  # ceil(3 x 1.3)
    (0.1, 5, 1.0, 10, (5, 5)),  # at least min_workers
    (0.5, 1, 1.5, 3, (1, 2)),  # floor(1.5) = 1 kept, 2 dispatched
    (0.3, 8, 1.3, 4, (4, 4)),  # never more than are there
    (0.01, 1, 1.3, 1000, (10, 13)),  # a thousand phones, K = 10
])
def test_a_rounds_sizes(fraction, minimum, overcommit, available, want):
    assert Sampling(fraction, minimum, "uniform", overcommit).sizes(available) == want


def test_a_draw_is_a_function_of_the_seed_and_the_round_and_data_weights_favour_data():
    s = Sampling(0.3, 1, "uniform", 1.0)
    workers = list(range(20))
    first = s.draw(workers, 7, (0, 0), None)
    assert first == s.draw(workers, 7, (0, 0), None) and len(first[0]) == 6
    assert first != s.draw(workers, 7, (1, 0), None)  # the next round draws anew
    assert first != s.draw(workers, 8, (0, 0), None)  # another seed, another draw
    by_data = Sampling(0.05, 1, "data", 1.0)  # one worker a round, weighted by data
    data = [0] * 19 + [500]  # only worker 19 has data
    assert {by_data.draw(workers, 7, (r, 0), data)[0][0] for r in range(10)} == {19}


@pytest.mark.parametrize("bad, message", [
    ({"fraction": 0.0}, "outer.fraction: must be in (0, 1]"),
    ({"fraction": 1.5}, "outer.fraction: must be in (0, 1]"),
    ({"min_workers": 0}, "outer.min_workers: must be an int >= 1"),
    ({"sample_by": "speed"}, "outer.sample_by: uniform or data"),
    ({"overcommit": 0.5}, "outer.overcommit: must be in [1, 10]"),
    # settings that would apply nowhere, or never let a round close (tiny_config: 3 workers)
    ({"min_workers": 100}, "outer.min_workers: counts a drawn round's workers, and rounds "
                           "are drawn only with outer.fraction < 1 or outer.overcommit > 1"),
    ({"fraction": 0.5, "min_workers": 4}, "outer.min_workers: 4 is more than the 3 workers"),
    ({"min_replies": 4}, "outer.min_replies: 4 is more than the 3 workers"),
    ({"late": "next"}, "outer.late: 'next' is for replies that come after their round closed"),
])
def test_bad_sampling_settings_are_one_line(bad, message):
    from fedlm.errors import ConfigError

    sets = [f"outer.{k}={json.dumps(v)}" for k, v in bad.items()]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        tiny_config("strategy=diloco", *sets)


def _rows(db, sql):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_each_round_dispatches_ceil_k_c_keeps_the_first_k_and_drops_the_rest(tmp_path):
    db = tmp_path / "s.db"
    run_inprocess(tiny_config(*SAMPLED), str(db))
    drawn = [json.loads(d) for (d,) in _rows(db, "SELECT detail FROM events WHERE "
                                                 "kind='round_drawn' ORDER BY id")]
    assert len(drawn) == 4 and drawn[0]["offered"] == list(range(10))  # all free at first
    s = Sampling(0.3, 1, "uniform", 1.3)
    for version, draw in enumerate(drawn):
        keep, dispatch = s.sizes(len(draw["offered"]))
        sent = _rows(db, f"SELECT worker FROM jobs WHERE base_version={version}")
        assert len(sent) == dispatch and {w for (w,) in sent} <= set(draw["offered"])
        applied = _rows(db, f"SELECT COUNT(*) FROM updates WHERE base_version={version} AND "
                            f"applied_version={version + 1}")[0][0]
        assert applied == keep  # the first K to report
    dropped = _rows(db, "SELECT COUNT(*) FROM updates WHERE applied_version IS NULL")[0][0]
    assert dropped >= 1  # over-committed replies that came after their round closed
    assert replay(db, 1).identical


def test_a_sampled_over_committed_run_replays_and_resumes_bit_for_bit(tmp_path):
    trains_replays_and_resumes(tmp_path, *SAMPLED, "updates=5", stop_at=3)


def test_a_round_deadline_closes_the_round_with_the_replies_it_has(tmp_path):
    """A job past its deadline is cut from its round (reliability.deadline: every job of
    a round is handed out at its opening, so it is the round's deadline); the round
    closes with the replies in by then."""
    db = tmp_path / "d.db"
    run_inprocess(tiny_config("strategy=diloco", "workers=6", "outer.fraction=0.5",
                              "fleet.step_times=[1, 1, 1, 1, 1, 50]", "inner.steps=3",
                              "reliability.deadline=10", "updates=6"), str(db))
    cut = _rows(db, "SELECT COUNT(*) FROM jobs WHERE reason='deadline'")[0][0]
    assert cut >= 1  # the slow worker, when drawn, is cut at the deadline
    assert _rows(db, "SELECT MAX(t_end) FROM intervals")[0][0] < 6 * 10 + 1
    assert replay(db, 1).identical


def test_a_failed_round_is_drawn_again_from_every_worker_free_and_replays(tmp_path):
    """A round cut below min_replies by the deadline starts over from the same version:
    its new draw is from every free worker (a full offer), not from those just freed."""
    db = tmp_path / "f.db"
    run_inprocess(tiny_config("strategy=diloco", "workers=6", "outer.fraction=0.5",
                              "outer.min_replies=3", "fleet.step_times=[1, 1, 1, 30, 30, 30]",
                              "inner.steps=3", "reliability.deadline=10", "updates=3"), str(db))
    draws = [json.loads(d) for (d,) in _rows(db, "SELECT detail FROM events WHERE "
                                                 "kind='round_drawn' ORDER BY id")]
    versions = [v for (v,) in _rows(db, "SELECT base_version FROM jobs ORDER BY job_id")]
    assert len(draws) > 3 or len(set(versions)) < len(versions)  # some round drawn again
    assert all(len(d["offered"]) >= 3 for d in draws)  # each from many free, not one
    assert replay(db, 1).identical


def test_sampling_on_a_churning_fleet_runs_and_replays(tmp_path):
    db = tmp_path / "c.db"
    run_inprocess(tiny_config("strategy=diloco", "workers=12", "outer.fraction=0.25",
                              "outer.overcommit=1.5", "fleet.availability={up=30, down=20}",
                              "updates=6"), str(db))
    assert _rows(db, "SELECT status FROM runs")[0][0] == "finished"
    assert replay(db, 1).identical


def test_a_semi_synchronous_round_closes_at_its_quorum_and_merges_stragglers_into_the_next(
        tmp_path):
    """fraction = q / N with overcommit = N / q: every worker dispatched, the round closes
    at the first q replies; with late = next the others' work joins the next round."""
    db = tmp_path / "q.db"
    run_inprocess(tiny_config("strategy=diloco", "workers=4", "outer.fraction=0.5",
                              "outer.overcommit=2", "outer.late=next", "profile=very",
                              "updates=5"), str(db))
    late = _rows(db, "SELECT COUNT(*) FROM updates WHERE applied_version > base_version + 1")
    assert late[0][0] >= 1  # a straggler's update went into a later round
    never = _rows(db, "SELECT COUNT(*) FROM updates u JOIN runs r ON r.id = u.run_id WHERE "
                      "u.applied_version IS NULL AND u.base_version < r.updates - 1")
    assert never[0][0] == 0  # none dropped (but those still held when the run ended)
    assert replay(db, 1).identical
