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
])
def test_no_run_beats_its_fleets_bound_and_its_goodput_is_a_share(tmp_path, sets):
    db = tmp_path / "r.db"
    run_inprocess(tiny_config(*sets, "updates=6", "fleet.jitter=0.0"), str(db))
    y, s = yardstick(db, 1), summarize(db, 1)
    assert y.steps == s.local_steps and y.time == s.virtual_time
    assert y.bound > 0 and y.ratio >= 1.0 - 1e-9, (y, sets)
    assert 0.0 < y.goodput <= 1.0
    compute = sum(w.compute for w in s.workers)
    present = sum(w.compute + w.communication + w.idle for w in s.workers)
    assert y.goodput <= compute / present + 1e-9  # lost work is not good
