"""The planner's topologies (star, ring, tree, hierarchical), Streaming DiLoCo
(fragments, overlap) and the scan, against closed forms and today's model."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from fedlm import plan
from fedlm.plan import PlanInput, scan
from fedlm.plan.report import prediction_dict
from fedlm.plan.topology import plan_topology, predict_topology, topology_bandwidth
from fedlm.sim.collectives import ring_bytes_per_site, ring_seconds, tree_seconds
from fedlm.sim.wire_sizes import payload_bytes
from tests._cli import assert_refused, run_cli

GBIT = 1e9 / 8
# The fields an exchange adds to a prediction (``fedlm.plan.topology.plan_topology``).
EXCHANGE = {"topology", "fragments", "overlap", "exposed", "hidden", "exchange_seconds",
            "bytes_per_exchange", "bytes_per_site", "bytes_total", "peak_bandwidth", "site"}
BASE = PlanInput(params=1e9, data_centres=8, step_time=(0.5,), H=100, latency=(0.05,),
                 down_bw=(GBIT,), up_bw=(GBIT,), compression="int8")


# ---------------------------------------------------------------------------
# P = 1, τ = 0 is today's plan, exactly
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("inp", [
    BASE, replace(BASE, jitter=0.05),
    replace(BASE, server_down=4 * GBIT, server_up=2 * GBIT, step_time=(0.5, 1.0, 2.0)),
    replace(BASE, daily_amplitude=0.5, data_centres=3),
    replace(BASE, workers_per_dc=4, hierarchical=True, intra_bw=1e9),
], ids=["alike", "jitter", "shared-link", "daily", "hierarchical"])
def test_one_fragment_no_overlap_is_todays_plan_exactly(inp):
    tp = plan_topology(inp)
    old = plan.predict_sync(inp)
    assert tp.time_per_update == old.time_per_update
    assert tp.compute_utilisation == old.compute_utilisation
    assert tp.comm_fraction == old.comm_fraction
    assert tp.idle_fraction == old.idle_fraction
    assert tp.hidden == 0.0
    assert topology_bandwidth(inp) == plan.bandwidth_needed(inp, "sync")
    out = predict_topology(inp)
    d = plan.report_dict(inp, out)
    # the one result type: today's prediction, field for field, with its exchange's bytes
    today = plan.jsonable(prediction_dict(old))
    assert {k: d["sync"][k] for k in today if k not in EXCHANGE} \
        == {k: v for k, v in today.items() if k not in EXCHANGE}
    assert d["sync"]["bytes_per_site"] > 0 and d["sync"]["hidden"] == 0.0
    assert d["async"] == plan.jsonable(prediction_dict(plan.predict_async(inp)))
    # the table: per job, sync beside async, the crossovers, the bytes under it
    text = plan.table(inp, out).splitlines()
    assert text[0] == plan.describe(inp) and any("download per job" in t for t in text)
    assert text[-2].startswith("async: ") and text[-1].startswith("bytes per outer step: ")


# ---------------------------------------------------------------------------
# Bytes: a ring's per site does not grow with the sites, a star's server does
# ---------------------------------------------------------------------------

def test_ring_bytes_per_site_do_not_grow_with_the_data_centres():
    payload = payload_bytes(1e14, "int8")
    per_site = {}
    for d in (2, 5, 20, 100):
        tp = plan_topology(replace(BASE, params=1e14, data_centres=d, topology="ring"))
        assert tp.bytes_per_site == pytest.approx(2 * (d - 1) / d * payload, rel=1e-12)
        assert tp.bytes_total == pytest.approx(d * tp.bytes_per_site, rel=1e-12)
        per_site[d] = tp.bytes_per_site
    assert max(per_site.values()) < 2 * payload  # ≈ 2P bytes whatever D
    assert per_site[100] / per_site[20] == pytest.approx(1, abs=0.05)


def test_star_server_bytes_grow_linearly_with_the_data_centres():
    one = payload_bytes(1e12, "int8") + payload_bytes(1e12, "fp32")
    for d in (2, 5, 20, 100):
        tp = plan_topology(replace(BASE, params=1e12, data_centres=d))
        assert tp.bytes_per_site == pytest.approx(one, rel=1e-12)
        assert tp.bytes_total == pytest.approx(d * one, rel=1e-12)


def test_cli_ring_per_site_traffic_is_independent_of_the_sites(tmp_path, monkeypatch):
    """The issue's done-when: fedlm plan --topology ring --params 100T --data-centres 20."""
    monkeypatch.chdir(tmp_path)
    got = {}
    for d in (20, 100):
        rc, out, err = run_cli(["plan", "--topology", "ring", "--params", "100T",
                                "--data-centres", str(d), "--step-time", "60",
                                "--compression", "int8", "--bandwidth", "100Gbit", "--json"])
        assert rc == 0, err
        data = json.loads(out)
        assert data["input"]["workers"] == d and data["async"] is None
        assert data["crossovers"]["async"] is None
        got[d] = data["sync"]
    payload = payload_bytes(1e14, "int8")
    assert got[20]["bytes_per_site"] == pytest.approx(1.9 * payload)
    assert got[100]["bytes_per_site"] == pytest.approx(1.98 * payload)
    assert got[100]["bytes_total"] / got[20]["bytes_total"] == pytest.approx(5 * 1.98 / 1.9)
    rc, out, err = run_cli(["plan", "--topology", "ring", "--params", "100T",
                            "--data-centres", "20", "--step-time", "60"])
    assert rc == 0, err
    assert "n/a" in out and "bytes per site per outer step" in out


# ---------------------------------------------------------------------------
# Time: closed forms of the collectives and of streaming
# ---------------------------------------------------------------------------

def test_ring_and_tree_time_is_compute_plus_the_allreduce():
    for top, formula in (("ring", ring_seconds), ("tree", tree_seconds)):
        inp = replace(BASE, topology=top, data_centres=6, down_bw=(GBIT, 2 * GBIT),
                      latency=(0.05, 0.2))
        c = formula(inp.up_bytes(), 6, GBIT, 0.2)  # slowest link, largest latency
        tp = plan_topology(inp)
        assert tp.time_per_update == pytest.approx(50 + c)
        assert tp.comm_fraction == pytest.approx(c / (50 + c))
        # the ring's time grows with D only through its 2(D − 1) latencies
    r20 = plan_topology(replace(BASE, topology="ring", data_centres=20)).time_per_update
    r100 = plan_topology(replace(BASE, topology="ring", data_centres=100)).time_per_update
    bw_part = lambda d: 2 * (d - 1) / d * BASE.up_bytes() / GBIT  # noqa: E731
    assert r100 - r20 == pytest.approx(bw_part(100) - bw_part(20) + 2 * 80 * 0.05)


@pytest.mark.parametrize("tau", [0, 2, 20])
def test_exposed_communication_is_what_the_overlap_cannot_hide(tau):
    """Ring, 4 sites, P = 4: a segment is 25 steps of 1 s plus max(0, C − τ·1 s)."""
    inp = PlanInput(params=1e9, data_centres=4, step_time=(1.0,), H=100, latency=(0.1,),
                    down_bw=(GBIT,), up_bw=(GBIT,), topology="ring", fragments=4,
                    overlap=tau)
    frag = payload_bytes(2.5e8, "fp32")  # 1 GB
    c = 2 * 3 * (frag / (4 * GBIT) + 0.1)  # 6 hops of 250 MB at 1 Gbit/s + 0.1 s = 12.6 s
    assert c == pytest.approx(12.6)
    tp = plan_topology(inp)
    assert tp.exchange_seconds == pytest.approx(c)
    assert tp.exposed == pytest.approx(4 * max(0.0, c - tau))
    assert tp.hidden == pytest.approx(4 * min(c, tau))
    assert tp.time_per_update == pytest.approx(4 * (25 + max(0.0, c - tau)))
    assert tp.bytes_per_exchange == pytest.approx(ring_bytes_per_site(frag, 4))
    assert tp.bytes_per_site == pytest.approx(4 * tp.bytes_per_exchange)


def test_streaming_a_star_hides_the_fragment_exchange():
    inp = replace(BASE, fragments=4, overlap=5)
    frag_down, frag_up = payload_bytes(2.5e8, "fp32"), payload_bytes(2.5e8, "int8")
    c = frag_down / GBIT + frag_up / GBIT + 2 * 0.05
    tp = plan_topology(inp)
    assert tp.exchange_seconds == pytest.approx(c)
    assert tp.time_per_update == pytest.approx(4 * (25 * 0.5 + max(0, c - 5 * 0.5)))
    assert tp.hidden == pytest.approx(4 * 2.5)


def test_streaming_cuts_the_bytes_of_one_exchange_p_fold():
    whole = plan_topology(replace(BASE, topology="ring"))
    for p in (2, 4, 10):
        part = plan_topology(replace(BASE, topology="ring", fragments=p))
        assert part.bytes_per_exchange == pytest.approx(whole.bytes_per_exchange / p, rel=1e-6)
        assert part.bytes_per_site == pytest.approx(whole.bytes_per_site, rel=1e-6)
    # with overlap the exchange has τ steps: its peak need is its bytes over τ · step
    tp = plan_topology(replace(BASE, topology="ring", fragments=4, overlap=5))
    assert tp.peak_bandwidth == pytest.approx(tp.bytes_per_exchange / (5 * 0.5))


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------

def test_data_centres_alone_means_one_worker_each(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(["plan", "--data-centres", "20", "--json"])
    assert rc == 0, err
    data = json.loads(out)
    assert data["input"]["data_centres"] == 20 and data["input"]["workers"] == 20
    rc, out, err = run_cli(["plan", "--hierarchical", "--workers", "8", "--data-centres", "2",
                            "--json"])
    assert rc == 0, err
    assert json.loads(out)["input"]["topology"] == "hierarchical"


@pytest.mark.parametrize("argv, fragment", [
    (["--topology", "mesh"], "--topology: must be one of star, ring, tree, hierarchical"),
    (["--H", "100", "--fragments", "4", "--overlap", "25"], "--overlap: must be >= 0 and < H/P"),
    (["--fragments", "3"], "--fragments: must divide H = 100"),
    (["--fragments", "0"], "--fragments: must be between 1 and H"),
    (["--topology", "ring", "--mode", "async"], "--mode: --topology ring has no async variant"),
    (["--fragments", "4", "--mode", "async"], "--mode: streaming has no async variant"),
    (["--topology", "ring", "--hierarchical"], "--hierarchical: is --topology hierarchical"),
    (["--topology", "tree", "--server-bandwidth", "10Gbit"], "--topology tree has no server"),
    (["--workers", "9", "--data-centres", "2"], "do not spread evenly"),
    (["--walltime", "--chips", "3", "--replicas", "2"], "--chips: must be a multiple"),
    (["--walltime", "--H", "30", "--fragments", "3", "--overlap", "10"], "--overlap: must be"),
])
def test_cli_refuses_in_one_line(tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    assert_refused(*run_cli(["plan", *argv]), fragment)


def test_cli_scan_writes_its_figures_table_and_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(scan, "SIZES", (1e9, 1e14))
    monkeypatch.setattr(scan, "DATA_CENTRES", (2, 20))
    rc, out, err = run_cli(["plan", "--scan", "--params", "100T", "--step-time", "60",
                            "--compression", "int8", "--data-centres", "20", "--latency", "0",
                            "--plot", str(tmp_path / "s")])
    assert rc == 0, err
    for name in ("scaling_topologies_bytes.png", "scaling_topologies_bandwidth.png"):
        assert (tmp_path / "s" / name).read_bytes()[:4] == b"\x89PNG"
    data = json.loads((tmp_path / "s" / "scaling_topologies.json").read_text())
    assert len(data["rows"]) == 2 * 2 * 4 * 2
    md = (tmp_path / "s" / "scaling_topologies.md").read_text()
    assert "    fedlm plan --params 100T --data-centres 20 --step-time 60 --latency 0" in md
    assert "--compression int8" in md and "--scan" in md
    rows = {(r["params"], r["data_centres"], r["topology"], r["streamed"]): r
            for r in data["rows"]}
    ring = [rows[(1e14, d, "ring", False)]["bytes_per_site"] for d in (2, 20)]
    star = [rows[(1e14, d, "star", False)]["bytes_total"] for d in (2, 20)]
    assert ring[1] / ring[0] == pytest.approx(1.9)  # 2(D−1)/D: ≈ flat
    assert star[1] / star[0] == pytest.approx(10)  # linear in D
    # the step time scales with the model (and no latency): the same bandwidth need
    need = [rows[(p, 20, "ring", False)]["bandwidth_10pct"] for p in (1e9, 1e14)]
    assert need[0] == pytest.approx(need[1], rel=0.01)
    assert np.isfinite(need).all()
