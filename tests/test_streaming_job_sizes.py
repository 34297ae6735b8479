"""Streaming DiLoCo on any job sizes (``fedlm.servers.fragment_steps``): the run's
``local_steps`` sizes each worker's outer step as it would a fragment round, the streamed
server splits it into P segments, fill's fragment rounds end together, a job shorter
than τ + 1 steps mixes in earlier, and such runs replay and resume bit for bit. (Fixed
sizes keep the built-in streaming's hashes: tests/test_golden_hashes.py.)"""

import sqlite3

import pytest

from fedlm.runner import run_inprocess
from fedlm.servers.fragment_steps import FragmentRoundSteps
from fedlm.strategies.fill_steps import Fill, FillOnline
from fedlm.strategies.fragments import segment_steps
from fedlm.store.schema import idle_fraction
from tests.conftest import tiny_config
from tests.support import trains_replays_and_resumes


def test_fill_is_shown_a_fragment_round_its_exposed_exchange_and_steps_in_units():
    # P = 2, τ = 1; steps of 1 s and 2 s; whole-model transfers of 4 s and 8 s: units of
    # 0.5 s and 1 s, exposed exchanges max(0, 4/2 − 1) = 1 s and max(0, 8/2 − 2) = 2 s
    policy = FragmentRoundSteps(Fill(), fragments=2, overlap=1)
    policy.start(steps=6, step_times=[1.0, 2.0], transfer_times=[4.0, 8.0])
    assert policy.sizes_rounds
    policy.offered(now=0.0, version=0, workers=[0, 1], busy=0)
    units = [policy.local_steps(w) for w in (0, 1)]  # the round ends at max(1 + 3, 2 + 6) = 8
    assert units == [14, 6]
    steps = [segment_steps(u, 2, 0) for u in units]
    assert steps == [7, 3] and [1 + 7 * 1.0, 2 + 3 * 2.0] == [8.0, 8.0]  # both end at 8 s


def test_what_a_job_took_is_told_in_units():
    policy = FragmentRoundSteps(FillOnline(), fragments=4, overlap=0)
    policy.start(steps=8, step_times=[1.0], transfer_times=[0.0])
    policy.observe(0, steps=5, seconds=15.0, transfer=0.5)  # 3 s a step: 0.75 s a unit
    assert policy.inner.step_seconds(0) == pytest.approx(0.75)
    assert policy.state_dict() == policy.inner.state_dict()  # checkpoints: the policy's own


FILL = ["strategy=diloco-fill", "profile=very", "workers=4", "updates=3", "inner.steps=6",
        "stream.fragments=2", "stream.overlap=1"]


def _jobs_and_idle(db) -> tuple[list, float]:
    with sqlite3.connect(db) as conn:
        jobs = conn.execute("SELECT base_version, j.worker, local_steps, step_time FROM jobs j "
                            "JOIN workers w ON w.worker = j.worker").fetchall()
        seconds = dict(conn.execute("SELECT kind, SUM(t_end - t_start) FROM intervals "
                                    "GROUP BY kind"))
    return jobs, idle_fraction(seconds)


def test_fill_s_fragment_rounds_give_each_worker_the_steps_that_end_with_the_slowest(tmp_path):
    ref = trains_replays_and_resumes(tmp_path, *FILL, stop_at=3)
    jobs, idle = _jobs_and_idle(ref)
    trained = {v for v, _, steps, _ in jobs if steps}  # the last round, a flush, trains none
    for version in trained:
        ends = [steps * t for v, _, steps, t in jobs if v == version]
        slowest = max(t for v, *_, t in jobs if v == version)
        assert max(ends) - min(ends) <= slowest + 1e-9  # all within a step of one another
    assert len(trained) == 3 * 2
    fixed = tmp_path / "fixed.db"
    run_inprocess(tiny_config(*FILL, "strategy=diloco"), str(fixed))
    assert idle < 0.5 * _jobs_and_idle(fixed)[1]  # the fast workers compute, not wait


def test_a_job_shorter_than_the_overlap_mixes_in_earlier_and_the_run_goes_on(tmp_path):
    # DyLU gives the slow workers one step a fragment round, fewer than τ + 1 = 2
    sets = ["strategy=diloco-dylu", "profile=very", "workers=4", "updates=3",
            "inner.steps=6", "stream.fragments=2", "stream.overlap=1"]
    ref = trains_replays_and_resumes(tmp_path, *sets, stop_at=3)
    with sqlite3.connect(ref) as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY status"))
        shortest = conn.execute("SELECT min(local_steps) FROM jobs WHERE local_steps > 0")
        assert shortest.fetchone()[0] == 1
    assert set(statuses) == {"done"}
