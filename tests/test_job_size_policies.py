"""The job-size policies that keep a comparison about one thing: the paper's DyLU as it
states it (compute only), fill sized from what the workers show, and fill's job sizes
without the barrier (for an asynchronous strategy). Each pinned by hand, then run."""

import pytest

from fedlm.config_load import ConfigError
from fedlm.runner import run_inprocess
from fedlm.store import summarize
from fedlm.strategies import registry
from fedlm.strategies.fill_steps import FillOnline, FillSizes
from fedlm.strategies.local_steps import DyLU, DyLUPaper
from tests.conftest import tiny_config

TOY = [0.58, 0.75, 1.51, 3.33]  # s/step: the paper's public toy example


def test_the_papers_dylu_is_floor_of_speed_ratio_times_h_whatever_the_links():
    """ALGORITHMS.md: at H = 20 with the toy speeds the paper's floor gives 20/15/7/3;
    unequal links change fedlm's link-aware DyLU, not the paper's rule."""
    paper = DyLUPaper()
    paper.start(steps=20, step_times=TOY, transfer_times=[0.0, 5.0, 1.0, 20.0])
    assert [paper.local_steps(w) for w in range(4)] == [20, 15, 7, 3]
    aware = DyLU()
    aware.start(steps=20, step_times=TOY, transfer_times=[0.0, 5.0, 1.0, 20.0])
    assert [aware.local_steps(w) for w in range(4)] != [20, 15, 7, 3]
    assert not paper.sizes_even()  # its whole jobs end apart on those links


def test_fill_sizes_are_a_fill_rounds_sizes_fixed_per_worker():
    """T = max(X + H/v) = max(0 + 10, 10 + 20) = 30 s; H_0 = 30, H_1 = (30 - 10) / 2 = 10."""
    sizes = FillSizes()
    sizes.start(steps=10, step_times=[1.0, 2.0], transfer_times=[0.0, 10.0])
    assert [sizes.local_steps(0), sizes.local_steps(1)] == [30, 10]
    assert not FillSizes.sizes_rounds  # no rounds: an asynchronous strategy may use it


def test_fill_online_sizes_the_next_round_from_the_observed_speeds():
    fill = FillOnline()
    fill.start(steps=10, step_times=[1.0, 2.0], transfer_times=[0.0, 0.0])
    fill.offered(now=0.0, version=0, workers=[0, 1], busy=0)
    assert [fill.local_steps(0), fill.local_steps(1)] == [20, 10]  # nominal: T = 20 s
    fill.observe(1, steps=10, seconds=40.0, transfer=0.0)  # worker 1 slowed to 4 s/step
    fill.offered(now=40.0, version=1, workers=[0, 1], busy=0)
    assert [fill.local_steps(0), fill.local_steps(1)] == [40, 10]  # T = 40 s: no idling
    state = fill.state_dict()
    again = FillOnline()
    again.load_state_dict(state)
    assert again.step_seconds(1) == 4.0


@pytest.mark.parametrize("sets", [
    ("strategy=diloco-fill", "local_steps=fill-online",
     "fleet.slowdown={factor = 4, normal = 20, slow = 10}"),
    ("strategy=delayed-nesterov", "local_steps=fill-sizes"),
    ("strategy=delayed-nesterov", "local_steps=dylu-paper"),
])
def test_each_policy_runs_where_it_belongs(tmp_path, sets):
    run_inprocess(tiny_config(*sets, "updates=4"), str(tmp_path / "r.db"))
    assert summarize(tmp_path / "r.db", 1).status == "finished"


def test_fill_online_is_refused_beside_an_asynchronous_strategy():
    with pytest.raises(ConfigError, match="sizes synchronous rounds"):
        tiny_config("strategy=delayed-nesterov", "local_steps=fill-online")
    assert registry.LOCAL_STEPS["fill-online"].sizes_rounds
