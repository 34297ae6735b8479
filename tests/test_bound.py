"""The fleet's yardstick (fedlm.sim.bound, fedlm.store.yardstick): the least virtual time a
fleet needs for a budget of inner steps, worked by hand on small fleets, and a lower
bound on every run whatever its method; goodput as the share of present time spent on
useful compute."""

import pytest

from fedlm.runner import run_inprocess
from fedlm.sim.bound import goodput, least_time
from fedlm.store import summarize
from fedlm.store.yardstick import yardstick
from tests.conftest import tiny_config


@pytest.mark.parametrize("step_times, trips, steps, want", [
    ([1.0, 1.0], [0.0, 0.0], 100, 50.0),  # two alike, no transfers
    ([1.0, 1.0], [0.0, 10.0], 100, 55.0),  # T + (T - 10) = 100
    ([1.0, 1.0], [0.0, 200.0], 100, 100.0),  # the far one cannot help in time
    ([0.5, 2.0], [4.0, 0.0], 90, 39.2),  # 2(T - 4) + T/2 = 90
    ([1.0], [3.0], 10, 13.0),  # one worker: its round trip, then its steps
    ([1.0, 1.0], [5.0, 5.0], 0, 0.0),  # nothing to train
])
def test_the_least_time_worked_by_hand(step_times, trips, steps, want):
    assert least_time(step_times, trips, steps) == pytest.approx(want)


@pytest.mark.parametrize("step_times, trips, away, steps, want", [
    ([1.0, 1.0], [0.0, 0.0], [[], [(10.0, 30.0)]], 100, 60.0),  # T + (T - 20) = 100
    ([1.0, 1.0], [0.0, 10.0], [[], [(0.0, 5.0)]], 100, 57.5),  # joins at 5: T + (T - 15)
    ([1.0, 1.0], [0.0, 10.0], [[(3.0, 3.0)], []], 100, 55.0),  # an empty span: no change
    ([1.0], [3.0], [[(1.0, 2.0), (5.0, 100.0)]], 10, 109.0),  # 4 s there by 100: 1 step
    ([1.0], [0.0], [[(20.0, 40.0), (10.0, 30.0)]], 40, 70.0),  # overlapping spans: one
    ([1.0], [0.0], [[(-9.0, -1.0), (-5.0, 10.0)]], 40, 50.0),  # before 0: from 0 on
    ([1.0, 1.0], [0.0, 0.0], [[(0.0, 1e9)], []], 100, 100.0),  # one never there
])
def test_the_least_time_of_a_fleet_whose_workers_are_away_worked_by_hand(
        step_times, trips, away, steps, want):
    assert least_time(step_times, trips, steps, away) == pytest.approx(want)


def test_the_least_time_with_workers_away_is_the_smallest_time_with_the_steps():
    """Against a brute-force count of each worker's present time, on a fleet drawn at
    random: the sweep's answer has the steps, a moment sooner does not."""
    import random

    rng = random.Random(7)
    times = [rng.uniform(0.2, 3.0) for _ in range(6)]
    trips = [rng.uniform(0.0, 30.0) for _ in range(6)]
    away = []
    for _ in times:
        t, spans = 0.0, []
        for _ in range(rng.randint(0, 8)):
            start = t + rng.uniform(0.0, 60.0)
            t = start + rng.uniform(0.0, 80.0)
            spans.append((start, t))
        away.append(spans)

    def capacity(T):
        def present(spans):
            return T - sum(max(0.0, min(b, T) - min(a, T)) for a, b in spans)
        return sum(max(0.0, (present(sp) - x) / s) for s, x, sp in zip(times, trips, away))
    steps = 500
    t = least_time(times, trips, steps, away)
    assert capacity(t) == pytest.approx(steps) and capacity(t - 1e-3) < steps
    assert t >= least_time(times, trips, steps)  # absences only take capacity away
    with pytest.raises(ValueError, match="one list of spans away per worker"):
        least_time(times, trips, steps, away[:2])


def test_the_least_time_is_the_smallest_time_at_which_the_fleet_could_have_the_steps():
    steps, times, trips = 777, [0.3, 1.1, 2.5, 0.7], [12.0, 0.5, 3.0, 40.0]
    t = least_time(times, trips, steps)
    capacity = lambda t: sum(max(0.0, (t - x) / s) for s, x in zip(times, trips))  # noqa: E731
    assert capacity(t) == pytest.approx(steps) and capacity(t * 0.999) < steps


def test_goodput_is_useful_compute_over_present_time():
    assert goodput(30.0, 40.0) == 0.75 and goodput(0.0, 0.0) == 0.0


@pytest.mark.parametrize("sets", [
    ("strategy=diloco", "profile=very"),
    ("strategy=diloco-fill", "profile=geo"),
    ("strategy=delayed-nesterov", "local_steps=dylu", "profile=halos", "workers=4"),
    ("strategy=delayed-nesterov", "local_steps=dylu",
     "fleet.slowdown={factor = 4, normal = 20, slow = 10}"),
    ("strategy=diloco-fill", "fleet.availability={up = 30, down = 10}", "updates=10"),
    ("strategy=delayed-nesterov", "local_steps=dylu", "fleet.availability={up = 20, down = 20}",
     "faults.offline=0.2"),
])
def test_no_run_beats_its_fleets_bound_and_its_goodput_is_a_share(tmp_path, sets,
                                                                   monkeypatch):
    db = tmp_path / "r.db"
    run_inprocess(tiny_config(*sets, "updates=6", "fleet.jitter=0.0"), str(db))
    y, s = yardstick(db, 1), summarize(db, 1)
    assert y.steps == s.local_steps and y.time == s.virtual_time
    assert y.bound > 0 and y.ratio >= 1.0 - 1e-9, (y, sets)
    if any("availability" in x for x in sets):  # its absences count: a tighter bound
        from fedlm.store import yardstick as module

        monkeypatch.setattr(module, "AWAY_KINDS", ("-", "-"))
        assert yardstick(db, 1).bound < y.bound
    assert 0.0 < y.goodput <= 1.0
    compute = sum(w.compute for w in s.workers)
    present = sum(w.compute + w.communication + w.idle for w in s.workers)
    assert y.goodput <= compute / present + 1e-9  # lost work is not good
    # present time is useful or unapplied compute, communication or idle: nothing else
    assert y.goodput + y.unapplied == pytest.approx(compute / present)
    assert y.communication == pytest.approx(sum(w.communication for w in s.workers) / present)
    assert y.idle == pytest.approx(sum(w.idle for w in s.workers) / present)
    assert y.unapplied >= -1e-12
    if "faults.offline=0.2" in sets:  # the jobs of workers gone offline never land
        assert y.unapplied > 0.01
    if sets == ("strategy=diloco", "profile=very"):  # every round's jobs are applied
        assert y.unapplied == pytest.approx(0.0, abs=1e-12)
    assert y.goodput + y.unapplied + y.communication + y.idle == pytest.approx(1.0)
