import pytest

from fedlm.sim import fleet
from fedlm.config import FleetConfig


def test_heterogeneity_levels_spread_speeds_geometrically():
    for preset, ratio in [("homogeneous", 1.0), ("slight", 1.5), ("moderate", 3.0),
                          ("very", 10.0)]:
        times = [p.step_time for p in fleet.profiles(FleetConfig(preset=preset), 4)]
        assert times == sorted(times)
        assert times[-1] / times[0] == pytest.approx(ratio)


def test_paper_toy_and_explicit_overrides():
    toy = [p.step_time for p in fleet.profiles(FleetConfig(preset="paper-toy"), 4)]
    assert toy == [0.58, 0.75, 1.51, 3.33]
    custom = fleet.profiles(FleetConfig(step_times=[9.0], regions=["asia"]), 2)
    assert custom[0].step_time == 9.0 and custom[0].region.name == "asia"
    assert custom[1].region.name == "local"


def test_geo_spreads_workers_over_regions():
    regions = [p.region.name for p in fleet.profiles(FleetConfig(preset="geo"), 6)]
    assert regions == ["us", "eu", "asia", "us", "eu", "asia"]


def test_job_timing_arithmetic_without_jitter():
    profs = fleet.profiles(FleetConfig(preset="homogeneous", jitter=0.0, regions=["eu"]), 1)
    t = fleet.JobTimer(profs, seed=0).timing(0, steps=10, down_bytes=1_000_000,
                                              up_bytes=2_000_000)
    eu = fleet.REGIONS["eu"]
    assert t.download == pytest.approx(eu.latency + 1e6 / eu.down_bw)
    assert t.compute == pytest.approx(10 * 1.0)
    assert t.upload == pytest.approx(eu.latency + 2e6 / eu.up_bw)
    assert t.total == pytest.approx(t.download + t.compute + t.upload)


def test_jitter_is_seeded_per_worker():
    profs = fleet.profiles(FleetConfig(jitter=0.3), 2)
    a, b = fleet.JobTimer(profs, seed=1), fleet.JobTimer(profs, seed=1)
    a.timing(0, 5, 0, 0)  # an extra draw for worker 0 must not shift worker 1
    assert a.timing(1, 5, 0, 0) == b.timing(1, 5, 0, 0)
    assert fleet.JobTimer(profs, seed=2).timing(1, 5, 0, 0) != b.timing(1, 5, 0, 0)
