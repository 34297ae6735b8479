"""The fleets study's arithmetic (experiments/fleets_report.py) on hand-made curves: the
time to the reference's final perplexity, the map's "first there", the horizon's budgets."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import fleets_report as fr  # noqa: E402

REF, DN = fr.REFERENCE, "DN + DyLU"


def run(curve, at_budget=None):
    time, final = curve[-1]
    return {"id": 0, "curve": curve, "time": time, "final": final, "steps": 1600,
            "updates": len(curve), "at_budget": at_budget or (time, final)}


def fleet(ref_curves, dn_curves, name="x"):
    return {(name, REF): {s: run(c) for s, c in ref_curves.items()},
            (name, DN): {s: run(c) for s, c in dn_curves.items()}}


def test_ratio_is_the_first_evaluation_at_or_below_the_references_final():
    runs = fleet({1: [(10, 8.0), (100, 6.0)]},
                 {1: [(10, 7.0), (40, 6.1), (60, 6.0), (90, 5.5)]})
    got, cells, never = fr.ratios(runs, "x", DN)
    assert got == [0.6] and never == 0 and cells == ["1: 60 (0.60)"]


def test_an_arm_that_ends_above_the_target_never_gets_there():
    runs = fleet({1: [(100, 6.0)], 2: [(100, 6.0)]},
                 {1: [(50, 5.9)], 2: [(50, 6.2), (80, 6.01)]})
    got, cells, never = fr.ratios(runs, "x", DN)
    assert got == [0.5] and never == 1 and cells[1] == "2: never"
    assert fr.mean_ratio(runs, "x", DN) == "0.50 (1/2)"


def test_at_equal_steps_the_target_is_where_the_reference_stood_at_its_budget():
    runs = fleet({1: [(50, 6.5), (100, 6.0)]}, {1: [(30, 6.4), (70, 6.0)]})
    runs[("x", REF)][1]["at_budget"] = (50, 6.5)
    assert fr.ratios(runs, "x", DN, at_budget=True)[0] == [0.6]
    assert fr.ratios(runs, "x", DN)[0] == [0.7]


def test_the_map_names_an_async_arm_only_where_it_gets_there_on_every_seed_sooner():
    sooner = fleet({1: [(100, 6.0)], 2: [(100, 6.0)]}, {1: [(50, 5.9)], 2: [(80, 6.0)]}, "a")
    partly = fleet({1: [(100, 6.0)], 2: [(100, 6.0)]}, {1: [(10, 5.0)], 2: [(90, 7.0)]}, "b")
    later = fleet({1: [(100, 6.0)]}, {1: [(150, 6.0)]}, "c")
    rows = fr.map_table({**sooner, **partly, **later})
    first = {row.split(" | ")[0].lstrip("| "): row.rstrip(" |").rsplit(" | ", 1)[1]
             for row in rows[2:] if row}
    assert first == {"a": DN, "b": REF, "c": REF}


def test_the_horizon_takes_the_main_study_as_its_small_1600_point():
    horizon = fleet({1: [(100, 6.0)]}, {1: [(50, 6.0)]}, "b net, tiny 2,400")
    main = {**fleet({1: [(100, 6.0)]}, {1: [(120, 6.0)]}, "b net"),
            **fleet({1: [(100, 6.0)]}, {1: [(20, 6.0)]}, "c other")}
    both = fr.with_main_budget(horizon, main)
    assert ("b net, small 1,600", DN) in both and ("c other, small 1,600", DN) not in both
    assert fr.ratios(both, "b net, small 1,600", DN)[0] == [1.2]
