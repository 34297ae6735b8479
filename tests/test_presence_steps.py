"""Jobs that fit their worker's presence (``local_steps = fill-presence``,
strategies/presence_steps.py): the rule by hand, the engine telling the policy every
departure and return at the time it happened, and a run that trains, replays and
resumes bit for bit."""

import sqlite3

import pytest

from fedlm.runner import run_inprocess
from fedlm.strategies.presence_steps import FillPresence
from tests.conftest import tiny_config
from tests.support import trains_replays_and_resumes


def _policy(workers: int = 2, steps: int = 40) -> FillPresence:
    p = FillPresence()
    p.start(steps=steps, step_times=[1.0] * workers)
    return p


def _sizes(p: FillPresence, now: float, workers: list[int]) -> list[int]:
    p.offered(now=now, version=int(now), workers=workers, busy=0)
    return [p.local_steps(w) for w in workers]


def test_until_anyone_leaves_the_jobs_are_fill_s():
    p = _policy()
    assert _sizes(p, 0.0, [0, 1]) == [40, 40]
    p.presence(1, at=0.0, here=False)  # away from its arrival on: a late joiner, no departure
    p.presence(1, at=3.0, here=True)
    assert p.left == [0, 0] and _sizes(p, 5.0, [0, 1]) == [40, 40]


def test_each_job_computes_no_longer_than_its_worker_is_expected_to_stay():
    p = _policy()
    p.presence(0, at=4.0, here=False)
    p.presence(0, at=6.0, here=True)
    # at 10 s: worker 0 stayed 4 + 4 s and left once, worker 1 stayed 10 s: the fleet's
    # mean stay 18 s; λ_0 = 2 / (8 + 18) = 1/13, λ_1 = 1 / (10 + 18) = 1/28 (steps of 1 s)
    assert _sizes(p, 10.0, [0, 1]) == [13, 28]
    assert p.rate(0) == pytest.approx(1 / 13) and p.rate(1) == pytest.approx(1 / 28)


def test_a_round_shorter_than_the_bound_keeps_fill_s_sizes_and_a_job_has_a_step():
    p = _policy(steps=5)
    for t in range(1, 20):  # worker 0 leaves a second after each arrival: λ_0 near 1
        p.presence(0, at=2.0 * t - 1, here=False)
        p.presence(0, at=2.0 * t, here=True)
    assert _sizes(p, 40.0, [0, 1]) == [1, 5]


CHURN = ["strategy=diloco-fill", "fleet.availability={up = 30, down = 10}", "updates=6",
         "profile=very"]


def test_the_engine_tells_the_policy_each_departure_and_return_when_it_happened(
        tmp_path, monkeypatch):
    told = []
    original = FillPresence.presence

    def spy(self, worker, *, at, here):
        told.append((worker, round(at, 6), here))
        original(self, worker, at=at, here=here)
    monkeypatch.setattr(FillPresence, "presence", spy)
    db = tmp_path / "p.db"
    run_inprocess(tiny_config(*CHURN, "local_steps=fill-presence"), str(db))
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT kind, worker, virtual_time, detail FROM events WHERE kind "
                            "IN ('worker_absent', 'worker_online') ORDER BY id").fetchall()
    logged = [(w, round(t, 6), kind == "worker_online") for kind, w, t, detail in rows
              if kind == "worker_absent" or "absent" in detail]
    assert any(not here for _, _, here in logged) and sorted(told) == sorted(logged)


def test_jobs_are_fill_s_until_a_departure_is_seen_then_bounded(tmp_path):
    def jobs(policy: str):
        db = tmp_path / f"{policy}.db"
        run_inprocess(tiny_config(*CHURN, f"local_steps={policy}"), str(db))
        with sqlite3.connect(db) as conn:
            first_gone = conn.execute("SELECT min(virtual_time) FROM events WHERE kind = "
                                      "'worker_absent' AND virtual_time > 0").fetchone()[0]
            return first_gone, conn.execute("SELECT t_dispatch, worker, local_steps FROM jobs "
                                             "ORDER BY job_id").fetchall()
    gone, fill = jobs("fill")
    _, bounded = jobs("fill-presence")
    before = [j for j in fill if j[0] <= gone]
    assert before and bounded[:len(before)] == before
    assert any(b[2] < f[2] for b, f in zip(bounded[len(before):], fill[len(before):]))


def test_a_presence_bounded_run_trains_replays_and_resumes(tmp_path):
    trains_replays_and_resumes(tmp_path, *CHURN, "local_steps=fill-presence", stop_at=3)
