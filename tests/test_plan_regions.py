"""The plan of ``strategy = "halos"`` (fedlm/plan/regions.py) against fedlm's real
engine clock (``fedlm.plan.check.simulate`` over ``fedlm.engine.dry_run``: instant
zero updates, only the virtual clock matters), on ``fedlm.plan.check``'s small configs: H = 5, tiny
models on links slow enough that a few thousand values take seconds, the links
inside a region slowed with ``network.intra_bw``.

Without jitter the plan's push walk is exact but for the run's start, so the
time per global merge must agree within 3% (the errors seen: 0.0-0.7%). With
jitter the workers drift apart and the plan averages over their phases: within
10% (seen: -3.2% to +3.4% at jitter 0.2 over these cases; down to -8% at 0.5,
not tested). The tests take a few seconds in all and are deterministic (the
simulator is seeded, the plan's draws of phases too).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedlm.errors import ConfigError
from fedlm.plan import regions
from fedlm.plan.check import case_config, simulate  # the engine's clock (fedlm.engine.dry_run)
from fedlm.plan.model import async_cycle

HET = "fleet.step_times=[1.0, 1.5, 2.0, 3.0]"
HOM = "fleet.step_times=[1.0, 1.0, 1.0, 1.0]"

# name, overrides (on check.case_config: 4 workers, H = 5, jitter 0), parameters
CASES = [
    ("2 + 2 alike, K = 1",
     ["fleet.topology={near = 2, far = 2}", "network.intra_bw=2e4", "outer.push_every=1", HOM],
     2_500),
    ("2 + 2, step times 1-3 s, K = 2",
     ["fleet.topology={near = 2, far = 2}", "network.intra_bw=2e4", "outer.push_every=2", HET],
     2_500),
    ("3 regions of 3 / 2 / 1, K = 2",
     ["workers=6", "fleet.topology={near = 3, mid = 2, far = 1}", "network.intra_bw=2e4",
      "outer.push_every=2", "fleet.step_times=[1.0, 1.2, 1.4, 1.7, 2.0, 3.0]"], 2_500),
    ("4 regions of 2, K = 4",
     ["workers=8", "fleet.topology={near = 2, mid = 2, far = 2, local = 2}",
      "network.intra_bw=5e4", "outer.push_every=4",
      "fleet.step_times=[1.0, 1.2, 1.4, 1.7, 2.0, 3.0, 1.1, 2.5]"], 5_000),
    ("the WAN push is the bottleneck, K = 1",
     ["fleet.topology={mid = 2, far = 2}", "network.intra_bw=1e5", "outer.push_every=1", HET],
     10_000),
]
JITTERED = ("3 regions of 3 / 2 / 1, K = 2, jitter 0.2",
            [*CASES[2][1], "fleet.jitter=0.2"], 2_500)


def _compare(overrides, params, updates):
    cfg = case_config(overrides, "halos", updates)
    return regions.predict_regions(cfg, params), simulate(cfg, params)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plan_matches_the_engine_clock_without_jitter(case):
    _, overrides, params = case
    plan, sim = _compare(overrides, params, 300)
    assert sim["updates"] == 300
    assert plan.time_per_update == pytest.approx(sim["time_per_update"], rel=0.03)
    assert plan.comm_fraction == pytest.approx(sim["comm_fraction"], abs=0.01)
    assert plan.compute_utilisation == pytest.approx(sim["compute_utilisation"], abs=0.01)
    assert plan.idle_fraction == sim["idle_fraction"] == 0.0
    assert plan.mode == "async" and plan.crowd_down == plan.crowd_up == 1.0


def test_plan_matches_the_engine_clock_with_jitter():
    _, overrides, params = JITTERED
    plan, sim = _compare(overrides, params, 1000)
    assert plan.time_per_update == pytest.approx(sim["time_per_update"], rel=0.10)
    assert plan.comm_fraction == pytest.approx(sim["comm_fraction"], abs=0.02)


def test_a_push_waits_for_the_round_trip_then_for_k_fresh_updates():
    """The WAN-bound case: the region's push period is RTT + W(K), not max(K/λ, RTT),
    and max() would miss the simulator by more than 10%."""
    _, overrides, params = CASES[-1]
    cfg = case_config(overrides, "halos", 300)
    sim = simulate(cfg, params)
    rate_max = 0.0
    for inp, wan in regions.region_inputs(cfg, params):
        ph = async_cycle(inp)
        rtt = 2 * wan.latency + 4 * params / wan.up_bw + 4 * params / wan.down_bw
        rate = float(np.sum(ph.count / ph.period))
        assert rtt > 1 / rate  # the WAN round trip outlasts the region's K = 1 updates
        rate_max += 1 / max(1 / rate, rtt)
    assert 1 / rate_max < 0.9 * sim["time_per_update"]


def test_one_worker_per_region_closed_form():
    """One worker (cycle J): the merge lands RTT after a report, the next push comes
    at the K-th report after that: J·(⌈RTT/J⌉ + K − 1)."""
    J = 6.0
    for K in (1, 2, 4):
        for rtt in (0.5, 5.9, 6.5, 20.1):
            got = regions._walk(np.array([J]), np.ones(1), np.zeros((1, 1)), K, rtt)[0]
            assert got == pytest.approx(J * (math.ceil(rtt / J) + K - 1))


def test_workers_in_step_report_together():
    # 2 alike workers in step, K = 2: both reports arrive at once, one push per
    # report after the round trip
    got = regions._walk(np.array([6.0]), np.array([2.0]), np.zeros((1, 1)), 2, 1.0)[0]
    assert got == pytest.approx(6.0)


def test_random_instant_wait():
    assert regions._random_wait(1, 1 / 6.0, 3) == pytest.approx(2.5 * 6.0)  # (K − ½)·J
    assert regions._random_wait(1000, 100.0, 50) == pytest.approx(0.5, rel=0.01)  # ≈ K/λ


def test_refuses_a_strategy_without_region_servers():
    cfg = case_config(["fleet.topology={near = 2, far = 2}"], "async-sgd", 10)
    with pytest.raises(ConfigError, match="halos"):
        regions.predict_regions(cfg, 1000)


def test_planning_imports_no_torch():
    code = ("import sys; from fedlm import config_load; "
            "from fedlm.plan.regions import predict_regions; "
            "cfg = config_load.load(None, ['strategy=halos', 'workers=4', "
            "'fleet.topology={us = 2, eu = 2}']); p = predict_regions(cfg, 1e8); "
            "assert 'torch' not in sys.modules, 'torch'; print(p.time_per_update)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) > 0


# ---------------------------------------------------------------------------
# fedlm plan --config / --set: a run config planned, halos included
# ---------------------------------------------------------------------------

HALOS = ["--set", "strategy=halos", "--set", "profile=halos", "--set", "workers=16"]


def test_fedlm_plan_plans_a_halos_config_with_its_region_servers():
    from fedlm import config_load, presets
    from tests._cli import run_cli

    rc, out, err = run_cli(["plan", *HALOS, "--json"])
    assert rc == 0, err
    data = json.loads(out)
    cfg = config_load.load(None, [a for a in HALOS if a != "--set"])
    params = presets.parameter_count(cfg.model, cfg.data.seq_len, 256)  # the config's model
    assert data["strategy"] == "halos" and data["input"]["params"] == params
    assert data["sync"] is None and data["crossovers"] is None  # two-level async only
    assert data["async"]["time_per_update"] == pytest.approx(
        regions.predict_regions(cfg, params).time_per_update, rel=1e-12)
    rc, out, err = run_cli(["plan", *HALOS, "--params", "1e6"])
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("strategy halos: a server in each of 4 regions, a push to the "
                               "global server every 2 region updates")
    assert sum(line.startswith("  region h") for line in lines) == 4
    header = next(line for line in lines if line.strip().startswith("async"))
    assert header.split() == ["async"] and "(halos)" in out  # one column: no sync variant


def test_fedlm_plan_plans_a_flat_config_as_the_simulator_times_it(tmp_path):
    from fedlm import config_load
    from fedlm.plan import from_config, predict_topology
    from tests._cli import assert_refused, run_cli

    path = tmp_path / "geo.toml"
    path.write_text('strategy = "diloco"\nworkers = 4\n[fleet]\npreset = "geo"\n')
    rc, out, err = run_cli(["plan", "--config", str(path), "--params", "2e6", "--json"])
    assert rc == 0, err
    data = json.loads(out)
    want = predict_topology(from_config(config_load.load(path), 2e6))
    assert data["sync"]["time_per_update"] == pytest.approx(want["sync"].time_per_update)
    assert data["async"]["time_per_update"] == pytest.approx(want["async"].time_per_update)
    # the flags that describe a fleet by hand are refused beside a config, in one line
    assert_refused(*run_cli(["plan", "--config", str(path), "--workers", "8"]),
                   "--workers: the config describes the fleet")
    assert_refused(*run_cli(["plan", "--set", "strategy=nope"]), "strategy: unknown strategy")
