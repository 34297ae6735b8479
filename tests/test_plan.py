"""The cost model (fedlm.plan) against closed forms, the network model and the simulator.
Its wire sizes and daily cycle, shared with the simulator: tests/test_wire_sizes.py."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from fedlm import plan
from fedlm.errors import ConfigError
from fedlm.sim.network import Flow, Network, fair_rates
from fedlm.plan import PlanInput, check, plots
from tests._cli import assert_refused, run_cli

GBIT = 1e9 / 8


# ---------------------------------------------------------------------------
# The plan against the simulator: the acceptance test
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["fedavg", "async-sgd"])
@pytest.mark.parametrize("case", check.CASES, ids=[c[0] for c in check.CASES])
def test_plan_matches_the_simulated_virtual_time(case, strategy):
    """Predicted seconds per global update = engine.now / engine.version within
    10% (fedlm's real engine, instant zero updates, fleet and network as
    configured), and the shares of time within 5 points."""
    name, overrides, params = case
    r = check.validate_case(name, overrides, params, strategy, check.updates_for(strategy, case))
    assert abs(r["error_pct"]) < 10, r
    assert r["comm_predicted"] == pytest.approx(r["comm_simulated"], abs=0.05), r
    assert r["util_predicted"] == pytest.approx(r["util_simulated"], abs=0.05), r
    assert r["idle_predicted"] == pytest.approx(r["idle_simulated"], abs=0.05), r


@pytest.mark.parametrize("case", check.TOPOLOGY_CASES, ids=[c[0] for c in check.TOPOLOGY_CASES])
def test_plan_matches_the_simulator_on_all_reduce_and_streaming_rounds(case):
    """The same for a ring or tree all-reduce and Streaming DiLoCo's rounds (a version
    per fragment's round: the planner's outer step / P), synchronous only."""
    name, overrides, params = case
    r = check.validate_case(name, overrides, params, "fedavg", check.updates_for("fedavg", case))
    assert abs(r["error_pct"]) < 10, r
    assert r["comm_predicted"] == pytest.approx(r["comm_simulated"], abs=0.05), r
    assert r["idle_predicted"] == pytest.approx(r["idle_simulated"], abs=0.05), r


def test_the_cases_span_light_to_heavy_communication():
    sims = [plan.predict(plan.from_config(check.case_config(o, "fedavg", 1), p))["sync"]
            for _, o, p in check.CASES]
    comm = [s.comm_fraction for s in sims]
    assert min(comm) < 0.06 and max(comm) > 0.7


# ---------------------------------------------------------------------------
# The pieces
# ---------------------------------------------------------------------------

def test_water_level_is_the_network_models_fair_share():
    rng = np.random.default_rng(0)
    for _ in range(300):
        caps = rng.uniform(0.1, 10, rng.integers(1, 9))
        capacity = float(rng.uniform(0.5, 30))
        level = plan.water_level(np.ones(len(caps)), caps, capacity)
        got = np.minimum(caps, level)
        want = fair_rates([Flow("up", 1.0, c) for c in caps], capacity)
        assert got == pytest.approx(want, rel=1e-9)


def test_fluid_transfers_end_when_the_network_model_says():
    rng = np.random.default_rng(1)
    for _ in range(30):
        n = int(rng.integers(1, 7))
        start = np.round(rng.uniform(0, 5, n), 3)
        size = rng.uniform(1, 20, n)
        cap = rng.uniform(1, 5, n)
        capacity = float(rng.uniform(2, 10))
        got = plan.fluid_finish_times(start, size, cap, capacity)
        net, want, t = Network(0, capacity), {}, 0.0
        pending = sorted(range(n), key=lambda i: start[i])
        while len(want) < n:  # drive the simulator's own network model
            nxt = net.next_finish()
            if pending and (nxt is None or start[pending[0]] <= nxt):
                i = pending.pop(0)
                t = float(start[i])
                net.add(t, (i, "up"), "up", float(size[i]), float(cap[i]))
            else:
                t = nxt
                for key, _ in net.advance(t):
                    want[key] = t
        assert got == pytest.approx([want[i] for i in range(n)], rel=1e-6)


def test_expected_max_of_jittered_jobs_matches_sampling():
    rng = np.random.default_rng(2)
    fixed, scale, count, sigma = np.array([3.0, 1.0]), np.array([10.0, 14.0]), \
        np.array([5.0, 2.0]), 0.3
    draws = [max((fixed[c] + scale[c] * rng.lognormal(0, sigma, int(count[c]))).max()
                 for c in range(2)) for _ in range(20_000)]
    assert plan.expected_max(fixed, scale, count, sigma) == pytest.approx(np.mean(draws),
                                                                          rel=5e-3)
    assert plan.expected_max(fixed, scale, count, 0.0) == pytest.approx(15.0)


def test_closed_forms_of_a_homogeneous_fleet():
    """N alike data centres, own links: round = bytes down/B + bytes up/B + 2L + H s;
    behind a server link S each flow gets min(B, S/N)."""
    p, n, s, h, lat, b = 2e9, 8, 0.5, 100, 0.05, GBIT
    inp = PlanInput(params=p, data_centres=n, step_time=(s,), H=h, latency=(lat,),
                    down_bw=(b,), up_bw=(b,), compression="int8")
    up = p + 4 * p / 256
    t = 4 * p / b + up / b + 2 * lat + h * s
    pred = plan.predict(inp)
    assert pred["sync"].time_per_update == pytest.approx(t)
    assert pred["async"].time_per_update == pytest.approx(t / n)
    assert pred["sync"].compute_utilisation == pytest.approx(h * s / t)
    assert pred["sync"].idle_fraction == pytest.approx(0.0, abs=1e-12)
    shared = replace(inp, server_down=2 * b, server_up=4 * b)  # 1/4 and 1/2 of B each
    t_shared = 4 * p / (2 * b / n) + up / (4 * b / n) + 2 * lat + h * s
    assert plan.predict_sync(shared).time_per_update == pytest.approx(t_shared)
    # the crossover: moving the bytes takes as long as the H steps
    per_param = (4 + 1 + 4 / 256) / b
    assert plan.crossover_params(inp, "sync") == pytest.approx((h * s - 2 * lat) / per_param,
                                                               rel=1e-3)


def test_async_throughput_is_the_sum_of_rates():
    inp = PlanInput(params=1e8, data_centres=3, step_time=(0.5, 1.0, 2.0), H=50,
                    latency=(0.01, 0.05, 0.1), down_bw=(GBIT, GBIT / 2, GBIT / 4),
                    up_bw=(GBIT / 2,), compression="bf16")
    jobs = [4e8 / d + 2e8 / (GBIT / 2) + 2 * lat + 50 * s
            for s, lat, d in zip((0.5, 1.0, 2.0), (0.01, 0.05, 0.1), (GBIT, GBIT / 2, GBIT / 4))]
    pred = plan.predict(inp)
    assert pred["async"].time_per_update == pytest.approx(1 / sum(1 / j for j in jobs))
    assert pred["sync"].time_per_update == pytest.approx(max(jobs))
    assert pred["async"].idle_fraction == 0.0
    assert pred["sync"].idle_fraction == pytest.approx(np.mean([1 - j / max(jobs) for j in jobs]))


def test_more_data_centres_on_a_shared_link_cost_more_and_compression_and_h_help():
    base = PlanInput(params=1e9, data_centres=8, step_time=(0.5,), H=100, latency=(0.05,),
                     down_bw=(GBIT,), up_bw=(GBIT,), server_down=10 * GBIT,
                     server_up=10 * GBIT)
    util = [plan.predict_sync(replace(base, data_centres=d)).compute_utilisation
            for d in (1, 8, 16, 64)]
    assert util[0] == pytest.approx(util[1]) and util[1] > util[2] > util[3]
    cross = plan.crossover_params(base, "sync")
    assert plan.crossover_params(replace(base, H=1000), "sync") > 9 * cross
    assert plan.crossover_params(replace(base, compression="int4", down_compression="int4"),
                                 "sync") > 7 * cross


def test_a_daily_cycle_averages_rates_over_the_hours():
    inp = PlanInput(params=1e9, data_centres=2, H=100, step_time=(0.5,), latency=(0.0,),
                    down_bw=(GBIT,), up_bw=(GBIT,), daily_amplitude=0.5)
    rounds = [plan.predict_sync(replace(inp, daily_amplitude=0.0, down_bw=(GBIT * f,),
                                        up_bw=(GBIT * f,))).time_per_update
              for f in plan.daily_factors(0.5)]
    assert plan.predict_sync(inp).time_per_update == pytest.approx(24 / sum(1 / r for r in rounds))


def test_a_hundred_thousand_alike_workers_plan_at_once():
    inp = PlanInput(params=1e10, data_centres=100_000, step_time=(1.0, 2.0), H=10,
                    server_up=1e12, jitter=0.1)
    pred = plan.predict(inp)
    assert 0 < pred["sync"].compute_utilisation < pred["async"].compute_utilisation < 1


@pytest.mark.parametrize("field, value, fragment", [
    ("params", 0.5, "params"), ("H", 0, "H"), ("step_time", (0.0,), "step_time"),
    ("compression", "int2", "compression"), ("server_up", -1.0, "server_up"),
    ("jitter", math.nan, "jitter"), ("daily_amplitude", 1.0, "daily_amplitude"),
])
def test_bad_inputs_are_refused_in_one_line(field, value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        plan.predict(replace(PlanInput(params=1e9), **{field: value}))


# ---------------------------------------------------------------------------
# fedlm plan
# ---------------------------------------------------------------------------

def test_cli_prints_sync_and_async_side_by_side(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(["plan", "--params", "1e9", "--workers", "8", "--step-time", "0.5",
                            "--H", "100", "--bandwidth", "1e9", "--latency", "0.05",
                            "--compression", "int8"])
    assert rc == 0, err
    assert "sync" in out and "async" in out and "compute utilisation" in out
    assert "communication = compute at" in out
    rc, out, err = run_cli(["plan", "--params", "7B", "--workers", "12", "--data-centres", "3",
                            "--regions", "us,eu,asia", "--server-bandwidth", "10Gbit",
                            "--hierarchical", "--json"])
    assert rc == 0, err
    data = json.loads(out)
    assert data["input"]["data_centres"] == 3 and data["input"]["workers"] == 12
    assert data["sync"]["time_per_update"] > data["async"]["time_per_update"] > 0
    assert set(data["crossovers"]) == {"sync", "async"}


def test_cli_plots(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "SIZES", np.logspace(7, 14, 8))
    monkeypatch.setattr(plots, "DATA_CENTRES", [1, 10, 100])
    rc, _, err = run_cli(["plan", "--workers", "4", "--plot", str(tmp_path / "p")])
    assert rc == 0, err
    for name in ("scaling_model_size.png", "scaling_data_centres.png"):
        assert (tmp_path / "p" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, fragment", [
    (["--params", "lots"], "--params: expected a number of parameters"),
    (["--workers", "0"], "--workers: must be >= 1"),
    (["--workers", "9", "--data-centres", "2"], "do not spread evenly"),
    (["--bandwidth", "fast"], "--bandwidth: expected a bandwidth"),
    (["--step-time", "0.5,-1"], "--step-time: must be seconds per inner step in"),
    (["--compression", "int2"], "--compression: must be one of"),
    (["--regions", "us,mars"], "--regions: unknown region 'mars'"),
    (["--H", "0"], "--H: must be >= 1"),
    # rounds drawn from the workers: the cost model would plan every worker a round
    (["--set", "workers=20", "--set", "data.partition=iid", "--set", "outer.fraction=0.1"],
     "outer.fraction: fedlm plan puts every worker in every round and does not model rounds "
     "drawn from the workers"),
    (["--set", "outer.overcommit=1.3"], "outer.overcommit: fedlm plan puts every worker"),
])
def test_cli_refuses_bad_input_in_one_line(tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    assert_refused(*run_cli(["plan", *argv]), fragment)


def test_plan_reads_the_halos_matrix_as_the_runs_do():
    """`--regions halos`: each data centre's link to the server from HALoS's matrix (the
    server in h0), the same links `fleet.preset = "halos"` gives a run."""
    from fedlm import config_load
    from fedlm.sim import fleet

    rc, out, err = run_cli(["plan", "--regions", "halos", "--data-centres", "4",
                            "--workers", "16", "--json"])
    assert rc == 0, err
    links = json.loads(out)["input"]
    runs = fleet.node_profiles(config_load.load(None, ["fleet.preset=halos", "workers=16"]))
    per_dc = [runs[4 * k].region for k in range(4)]
    assert links["down_bw"] == [r.down_bw for r in per_dc]
    assert links["up_bw"] == [r.up_bw for r in per_dc]
    assert links["up_bw"][3] == 0.202e9 / 8  # h3 -> h0, as HALoS measured it


def test_a_plan_of_a_changing_fleet_says_what_it_leaves_out(capsys):
    """The cost model's fleet is steady: slow-downs and absences are named, not ignored."""
    from fedlm.cli import main

    assert main(["plan", "--set", "fleet.slowdown={factor=4, normal=300, slow=150}",
                 "--set", "fleet.availability={up=600, down=120}"]) == 0
    out = capsys.readouterr().out
    assert "(planned for a steady fleet: absences, slow-downs" in out
    assert "not modelled; `fedlm run` simulates them)" in out
