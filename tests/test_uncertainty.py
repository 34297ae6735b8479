"""Means, intervals, paired differences and curve bands over seeds, against values
worked out by hand (and t quantiles against the printed tables)."""

import math

import numpy as np
import pytest

from fedlm.sweep.uncertainty import band, estimate, paired, paired_estimate, ratio, \
    relative_difference, t975


def test_t_quantiles_match_the_printed_table_and_tend_to_the_normal():
    # t_{0.975, df} as printed in every table (3 decimals)
    for df, t in [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262), (10, 2.228),
                  (29, 2.045), (30, 2.042), (40, 2.021), (60, 2.000), (120, 1.980)]:
        assert t975(df) == pytest.approx(t, abs=6e-4), df
    # beyond the table: decreasing, never below the normal quantile, and reaching it
    beyond = [t975(df) for df in range(30, 2000)]
    assert all(a > b for a, b in zip(beyond, beyond[1:]))
    assert t975(10**9) == pytest.approx(1.959964, abs=1e-6)
    with pytest.raises(ValueError, match="df"):
        t975(0)


def test_mean_sd_and_interval_of_one_two_three():
    e = estimate([1, 2, 3])
    assert (e.n, e.mean, e.sd) == (3, 2.0, 1.0)
    assert e.half_width == pytest.approx(4.3027 / math.sqrt(3))  # t_{0.975,2} · sd / √n
    assert (e.low, e.high) == pytest.approx((2 - 2.48416, 2 + 2.48416), abs=1e-4)


def test_two_values_use_the_wide_t_of_one_degree_of_freedom():
    e = estimate([10.0, 12.0])
    assert e.sd == pytest.approx(math.sqrt(2))
    assert e.half_width == pytest.approx(12.7062 * math.sqrt(2) / math.sqrt(2))


def test_one_value_has_no_spread_and_no_interval():
    e = estimate([5.0])
    assert (e.n, e.mean, e.sd, e.half_width, e.low, e.high) == (1, 5.0, None, None, None, None)


def test_identical_values_have_a_zero_width_interval():
    e = estimate([7.0, 7.0, 7.0])
    assert (e.sd, e.half_width) == (0.0, 0.0)


@pytest.mark.parametrize("values", [[], [1.0, float("nan")], [float("inf")]])
def test_no_values_or_non_finite_ones_are_refused(values):
    with pytest.raises(ValueError, match="values"):
        estimate(values)


def test_paired_differences_are_seed_by_seed_and_skip_unmatched_seeds():
    arm = {0: 11.0, 1: 12.0, 2: 13.0, 3: 99.0}  # seed 3: its reference run failed
    ref = {2: 10.0, 0: 10.0, 1: 10.0}
    assert paired(arm, ref) == pytest.approx([10.0, 20.0, 30.0])  # in seed order
    e = paired_estimate(arm, ref)
    assert (e.n, e.mean, e.sd) == pytest.approx((3, 20.0, 10.0))
    assert e.half_width == pytest.approx(4.3027 * 10 / math.sqrt(3))
    assert paired({0: 1.0}, {1: 1.0}) == []
    assert paired_estimate({0: 1.0}, {1: 1.0}) is None


def test_pairing_removes_what_the_seeds_share():
    """Arm and reference move together with the seed: their means' intervals overlap
    widely, the paired difference is exactly +10% every time (zero width)."""
    ref = {s: v for s, v in enumerate([8.0, 10.0, 12.0])}
    arm = {s: 1.1 * v for s, v in ref.items()}
    assert estimate(arm.values()).half_width > 4
    e = paired_estimate(arm, ref)
    assert e.mean == pytest.approx(10.0) and e.half_width == pytest.approx(0.0, abs=1e-9)


def test_relative_difference_and_ratio():
    assert relative_difference(11.0, 10.0) == pytest.approx(10.0)
    assert relative_difference(9.0, 10.0) == pytest.approx(-10.0)
    assert paired({0: 50.0, 1: 40.0}, {0: 100.0, 1: 100.0}, ratio) == [0.5, 0.4]


def test_the_none_seed_pairs_with_itself():
    """A sweep without seeds has one cell per arm, under seed None."""
    assert paired({None: 11.0}, {None: 10.0}) == pytest.approx([10.0])


def test_band_is_mean_min_and_max_on_a_common_grid():
    a = ([0.0, 10.0], [10.0, 0.0])  # y = 10 - x
    b = ([0.0, 10.0], [20.0, 10.0])  # y = 20 - x
    bd = band([a, b], points=11)
    assert np.allclose(bd.x, np.arange(11.0))
    assert np.allclose(bd.mean, 15.0 - bd.x)
    assert np.allclose(bd.low, 10.0 - bd.x) and np.allclose(bd.high, 20.0 - bd.x)


def test_band_starts_where_every_curve_has_begun_and_holds_a_finished_curve():
    short = ([2.0, 4.0], [6.0, 4.0])  # ends at x = 4, at 4.0
    long = ([0.0, 10.0], [10.0, 0.0])
    bd = band([short, long], points=5)
    assert bd.x[0] == 2.0 and bd.x[-1] == 10.0  # no extension backwards
    at = dict(zip(bd.x, zip(bd.low, bd.high)))
    assert at[8.0] == pytest.approx((2.0, 4.0))  # the short curve keeps its last value
    assert 4.0 in bd.x  # every curve's own points are on the grid: no kink cut off


def test_one_curve_is_its_own_band():
    bd = band([([1.0, 2.0, 3.0], [5.0, 4.0, 3.0])], points=3)
    assert np.allclose(bd.mean, [5.0, 4.0, 3.0])
    assert np.allclose(bd.low, bd.high)
