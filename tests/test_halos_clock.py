"""HALoS's simulator's round times beside fedlm's (experiments/halos_clock.py): the
committed JSON and the table in docs/far_workers.md ("An outside clock") are what the
script computes now, and the agreements and differences the doc states hold."""

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import halos_clock as hc  # noqa: E402


@pytest.fixture(scope="module")
def res():
    return hc.results()


def _rows(res):
    return {(r["arm"], r["fedlm_fleet"]): r for r in res["rows"]}


def _same(a, b, path="") -> None:
    """Equal, floats to 1e-12 relative."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-12), path
    else:
        assert a == b, path


def test_the_committed_json_is_what_the_script_computes(res):
    committed = json.loads((ROOT / "experiments/results/halos_clock.json").read_text())
    _same(json.loads(json.dumps(res)), committed)


def test_the_doc_table_is_the_scripts(res):
    doc = (ROOT / "docs/far_workers.md").read_text()
    section = doc.split("## An outside clock: HALoS's simulator", 1)[1].split("\n## ", 1)[0]
    for r in res["rows"]:
        h, f = r["halos"], r["fedlm"]
        row = (f"| {r['arm']} | {r['fedlm_fleet']} | {h['round_s']:.2f} ({h['compute_s']:.2f} "
               f"+ {h['comm_s']:.2f}) | {f['round_s']:.2f} ({f['compute_s']:.2f} + "
               f"{f['comm_s']:.2f}) | {r['ratio']:.3f} |")
        assert row in section, row


def test_halos_formulas_on_its_fleet(res):
    assert res["params"] == 70_426_624  # Pythia-70M, as its model card counts it
    assert hc.halos_ring_gbps(hc.HALOS_BANDWIDTHS) == 0.127
    dl = _rows(res)[("DiLoCo", "preset halos (server in h0)")]["halos"]
    # the slowest worker, 0.107 of the fastest's 0.907, runs H = 32 steps
    assert dl["compute_s"] == pytest.approx(0.238391 * 32 * 0.907 / 0.107, rel=1e-12)
    assert dl["comm_s"] == pytest.approx(2 * 15 * 4 * 70_426_624 / 16 * 8 / 0.127e9, rel=1e-12)


def test_agreement_and_differences_as_the_doc_states(res):
    rows = _rows(res)
    preset, h2 = "preset halos (server in h0)", "fleet.matrix, server in h2"
    # the same bandwidth: DiLoCo agrees exactly, DynUpd within its rounding
    assert rows[("DiLoCo", h2)]["ratio"] == pytest.approx(1.0, rel=1e-12)
    assert rows[("DiLoCo + DynUpd", h2)]["ratio"] == pytest.approx(0.995, abs=5e-4)
    # the preset: fedlm's ring runs at h3-h0's 0.202 Gbit/s, HALoS's at 0.127
    for arm in ("DiLoCo", "DiLoCo + DynUpd"):
        r = rows[(arm, preset)]
        assert r["fedlm"]["ring_gbit"] == pytest.approx(0.202)
        assert r["fedlm"]["comm_s"] / r["halos"]["comm_s"] == pytest.approx(0.127 / 0.202)
        assert r["fedlm"]["latency_s"] == 0.0
    assert rows[("DiLoCo", preset)]["ratio"] == pytest.approx(0.874, abs=5e-4)
    assert rows[("DiLoCo + DynUpd", preset)]["ratio"] == pytest.approx(0.699, abs=5e-4)
    # fedlm plan's cost model gives the simulator's DiLoCo round
    for fleet in (preset, h2):
        f = rows[("DiLoCo", fleet)]["fedlm"]
        assert f["plan_round_s"] == pytest.approx(f["round_s"], rel=1e-12)
    # DynUpd's rounding: HALoS ceil, fedlm's dylu nearest
    h = rows[("DiLoCo + DynUpd", preset)]["halos"]["steps"]
    f = rows[("DiLoCo + DynUpd", preset)]["fedlm"]["steps"]
    assert (sum(h), sum(f)) == (325, 317)
    assert sum(a == b + 1 for a, b in zip(h, f)) == 8 and sum(a == b for a, b in zip(h, f)) == 8
    speeds = hc.halos_worker_speeds()
    assert h == [max(1, math.ceil(32 * s)) for s in speeds]
    assert f == [max(1, math.floor(32 * s + 0.5)) for s in speeds]
