"""The frontier study's arithmetic (experiments/frontier_report.py) on hand-made runs: the
best synchronous arm is the one the runs put lowest, every arm is paired with it seed
by seed on both clocks, the time to its final comes with its resolution, and the
ranking check says when the two horizons order the arms differently."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import frontier_report as fr  # noqa: E402
from fedlm.store.yardstick import Yardstick  # noqa: E402

STICK = Yardstick(steps=100, bound=1.0, time=2.0, goodput=0.5, unapplied=0.1,
                  communication=0.3, idle=0.1)


def run(points, stick=STICK):
    """points: (virtual time, tokens, perplexity) per evaluation."""
    return fr.Run(final=points[-1][2], time=points[-1][0], curve=list(points), stick=stick)


def test_the_best_synchronous_arm_is_the_lowest_of_those_named():
    arms = {"fill": {1: run([(10, 100, 6.0)])}, "muon": {1: run([(10, 100, 5.5)])},
            "async": {1: run([(5, 100, 5.0)])}}
    assert fr.best_sync(arms, ["fill", "muon"]) == "muon"  # "async" is not a candidate
    with pytest.raises(SystemExit, match="none of the synchronous arms"):
        fr.best_sync(arms, ["absent"])


def test_gaps_are_paired_by_seed_at_equal_steps_and_at_equal_time():
    best = {1: run([(10, 100, 8.0), (20, 200, 6.0)]), 2: run([(10, 100, 8.0), (20, 200, 5.0)])}
    # seed 1 ends sooner with fewer tokens: both compared at 100 tokens and at 10 s;
    # seed 2 takes twice the time: at 200 tokens 5.5 against 5.0, at 20 s 8.0 against 5.0
    arm = {1: run([(10, 100, 7.2)]), 2: run([(10, 100, 8.0), (40, 200, 5.5)])}
    steps, times, clock = fr.gaps(arm, best)
    assert steps.n == 2 and steps.mean == pytest.approx((-10.0 + 10.0) / 2)
    assert times.mean == pytest.approx((-10.0 + 60.0) / 2)
    assert clock.mean == pytest.approx((0.5 + 2.0) / 2)


def test_time_to_the_best_final_says_how_many_get_there_and_to_what_resolution():
    best = {1: run([(100, 1, 6.0)]), 2: run([(100, 1, 6.0)])}
    arm = {1: run([(20, 1, 7.0), (60, 1, 5.9)]), 2: run([(50, 1, 6.5)])}
    assert fr.time_to_best(arm, best) == "0.60 (1 of 2, grid 0.40)"
    assert fr.time_to_best({1: run([(50, 1, 6.5)])}, best) == "not reached (0 of 1)"


def test_the_ranking_check_names_a_change_of_order():
    long_runs = {"b": {"x": {1: run([(1, 1, 5.0)])}, "y": {1: run([(1, 1, 6.0)])}}}
    same = {"b": {"x": {1: run([(1, 1, 7.0)])}, "y": {1: run([(1, 1, 8.0)])}}}
    swapped = {"b": {"x": {1: run([(1, 1, 9.0)])}, "y": {1: run([(1, 1, 8.0)])}}}
    assert "The order is the same at both horizons." in fr.ranking(long_runs, same)
    assert "The order is not the same at both horizons." in fr.ranking(long_runs, swapped)


def test_held_out_names_split_fleet_arm_and_seed():
    m = fr.NAME.match("b halos net: sync + fill, Muon inside @ halos [outer.lr=0.7] seed 301")
    assert m["arm"].partition(": ") == ("b halos net", ": ", "sync + fill, Muon inside")
    assert m["seed"] == "301" and m["profile"] == "halos"
    assert fr.NAME.match("d trace churn: sync + fill @ moderate seed 300")["seed"] == "300"
