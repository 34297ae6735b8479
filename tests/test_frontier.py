"""The frontier figure of a sweep report (``fedlm.sweep.frontier``): each arm's point is
the report's own estimates, its time over the fleet's bound against its per-update gap
to its reference, paired by seed, with 95% intervals."""

from types import SimpleNamespace as NS

import pytest

from fedlm.sweep import frontier

FINALS = {"ref": {0: 10.0, 1: 10.0, 2: 10.0}, "fast": {0: 11.0, 1: 12.0, 2: 13.0},
          "lone": {0: 9.0}}
RATIOS = {"ref": [1.5, 1.5, 1.5], "fast": [1.0, 1.2, 1.4], "lone": [0.9]}


def _report(unbounded: str = ""):
    groups, yardsticks, run_id = {}, {}, 0
    for arm, finals in FINALS.items():
        group = {}
        for (seed, final), r in zip(finals.items(), RATIOS[arm]):
            run_id += 1
            group[seed] = NS(run_id=run_id, summary=NS(final_perplexity=final))
            yardsticks[run_id] = NS(ratio=None if arm == unbounded else r)
        groups[(arm, "very")] = group
    return NS(arms=list(FINALS), profiles=["very", "moderate"], groups=groups,
              yardsticks=yardsticks, whose="ref's",
              ref_group=lambda arm, group: groups[("ref", "very")])


def test_each_arm_is_its_time_over_the_bound_against_its_paired_gap():
    points = {p.arm: p for p in frontier.points(_report(), "very")}
    assert points["ref"].gap.mean == 0.0 and points["ref"].bound.mean == pytest.approx(1.5)
    fast = points["fast"]  # +10, +20, +30% against 10: mean 20, t(0.975, 2) · 10 / √3
    assert fast.gap.mean == pytest.approx(20.0) and fast.gap.half_width == pytest.approx(24.84,
                                                                                       abs=0.01)
    assert fast.bound.mean == pytest.approx(1.2) and fast.bound.n == 3
    assert points["lone"].gap.n == 1 and points["lone"].gap.half_width is None
    assert frontier.points(_report(), "moderate") == []  # no run there: no figure


def test_an_arm_without_a_bound_is_left_out_and_a_figure_is_drawn(tmp_path):
    assert "fast" not in {p.arm for p in frontier.points(_report("fast"), "very")}
    (png,) = frontier.plot(_report(), tmp_path / "study")
    assert png.name == "study_frontier_very.png" and png.stat().st_size > 10_000
