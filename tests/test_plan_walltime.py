"""The wall-clock model of Charles et al. 2025 ("Scaling Laws for DiLoCo",
arXiv 2503.09799, appendix A) in ``fedlm.plan.walltime``.

What the paper gives and what it does not: appendix A states the equations
(A.1 compute 6ND/(RQ); A.2 the all-reduce lower bound 2N/W·(1 − 1/R) + ε and
the totals of Data-Parallel, DiLoCo M = 1 and M ≥ 2; A.3 Q = 300 TFLOP/s and
the three network archetypes) but no table of numbers computed with them:
its results are plots (Figures 6 and 12) for chip counts R it does not list.
Its only table of utilisations, Table 6, comes from a different simulator
(Douillard et al. 2025's, which also overlaps gradient reduction with the
backward pass) on a quantised bandwidth grid, so it is no reproduction target
for appendix A. These tests therefore check the equations on hand-computed
cases, the appendix's stated constants, and the one quantitative claim the
appendix makes about its own model (H ≥ W0/W1 ⇒ outer ≤ half of communication).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from fedlm.plan import walltime
from fedlm.plan.walltime import WallInput
from tests._cli import run_cli

GBIT = 1e9 / 8  # bytes/s
# N = 1e9, D = 2e10, B = 1e6 -> T = 2e4 steps; R = 100 chips of 1e14 FLOP/s; W0 = 400 Gbit/s,
# W1 = 10 Gbit/s; 2 bytes (bf16) a parameter
CASE = WallInput(params=1e9, tokens=2e10, batch=1e6, chips=100, flops_per_chip=1e14,
                 replicas=4, H=30, intra_bw=400 * GBIT, intra_latency=1e-4, inter_bw=10 * GBIT,
                 inter_latency=1e-2, bytes_per_param=2)


def test_the_appendix_constants():
    # A.3: Q = 300 teraflops; high 400 Gbit/s, 1e-4 s; medium 100, 1e-3; low 10, 1e-2
    # (here in bytes/s, as the rest of fedlm)
    assert walltime.PAPER_Q == 300e12
    assert walltime.NETWORKS == {"high": (50e9, 1e-4), "medium": (12.5e9, 1e-3),
                                 "low": (1.25e9, 1e-2)}
    assert WallInput(1, 1, 1, 2).bytes_per_param == 2  # bf16, as the paper trains


def test_hand_computed_times():
    compute = 6 * 1e9 * 2e10 / (100 * 1e14)  # = 12,000 s
    # 2 GB of bf16 over 1.25 GB/s (10 Gbit/s) and 50 GB/s (400 Gbit/s)
    across = 2 * 2e9 / 1.25e9 * (1 - 1 / 100) + 1e-2  # = 3.178 s, over all R chips
    inside = 2 * 2e9 / 5e10 * (1 - 4 / 100) + 1e-4  # = 0.0769 s, over R/M chips
    assert compute == pytest.approx(12_000) and across == pytest.approx(3.178)
    dp = walltime.walltime(CASE, "data-parallel")
    assert dp.compute == pytest.approx(compute)
    assert dp.inner_comm == pytest.approx(2e4 * across)
    assert dp.total == pytest.approx(compute + 2e4 * across)
    m1 = walltime.walltime(CASE, "diloco-m1")
    assert m1.inner_comm + m1.outer_comm == pytest.approx(2e4 * (1 + 1 / 30) * across)
    m4 = walltime.walltime(CASE, "diloco")
    assert m4.inner_comm == pytest.approx(2e4 * inside)
    assert m4.outer_comm == pytest.approx(2e4 / 30 * across)
    assert m4.compute_utilisation == pytest.approx(compute / (compute + 2e4 * inside
                                                              + 2e4 / 30 * across))


def test_streaming_and_overlap_as_read_here():
    # P fragments: the same bytes, P latencies per H steps
    frag = 2 * 5e8 / 1.25e9 * (1 - 1 / 100) + 1e-2  # a quarter of the 2 GB
    p4 = walltime.walltime(replace(CASE, H=32, fragments=4), "diloco")
    assert p4.outer_comm == pytest.approx(2e4 / 32 * 4 * frag)
    # overlap τ = 2: each fragment hides behind 2 inner steps (compute 0.6 s + 0.0769 s)
    step = 0.6 + 2 * 2e9 / 5e10 * 0.96 + 1e-4
    o = walltime.walltime(replace(CASE, H=32, fragments=4, overlap=2), "diloco")
    assert o.outer_comm == pytest.approx(2e4 / 32 * 4 * max(0, frag - 2 * step))
    assert o.outer_hidden == pytest.approx(2e4 / 32 * 4 * min(frag, 2 * step))


def test_outer_steps_cost_at_most_half_when_h_reaches_w0_over_w1():
    """A.2: "as long as H ≥ W0/W1, the outer communication steps incur at most half
    of the total communication cost" (latencies aside, many chips)."""
    inp = replace(CASE, chips=1e6, intra_latency=0.0, inter_latency=0.0)
    h = int(inp.intra_bw / inp.inter_bw)  # 40
    w = walltime.walltime(replace(inp, H=h), "diloco")  # half, but for (1 − 1/R) vs (1 − M/R)
    assert w.outer_comm / (w.inner_comm + w.outer_comm) == pytest.approx(0.5, rel=1e-5)
    w = walltime.walltime(replace(inp, H=2 * h), "diloco")
    assert w.outer_comm <= 0.5 * (w.inner_comm + w.outer_comm)
    w = walltime.walltime(replace(inp, H=h // 4), "diloco")
    assert w.outer_comm > 0.5 * (w.inner_comm + w.outer_comm)


def test_bandwidth_for_a_utilisation_inverts_the_model():
    for algo in ("data-parallel", "diloco-m1", "diloco"):
        bw = walltime.bandwidth_for(CASE, algo, 0.5)
        if bw == float("inf"):
            continue
        u = walltime.walltime(replace(CASE, inter_bw=bw), algo).compute_utilisation
        assert u == pytest.approx(0.5, abs=1e-6)
    # the M = 4 inner all-reduce alone (0.0769 s a step vs 0.6 s compute) caps it at 88.6%
    assert walltime.bandwidth_for(CASE, "diloco", 0.9) == float("inf")


def test_cli_walltime(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(["plan", "--walltime", "--params", "10B", "--chips", "1e4",
                            "--replicas", "4", "--H", "100", "--json"])
    assert rc == 0, err
    data = json.loads(out)
    assert set(data["algorithms"]) == {"data-parallel", "diloco-m1", "diloco"}
    assert data["input"]["tokens"] == 2e11 and data["input"]["bytes_per_param"] == 2
    # the flags' and the table's bit/s, the JSON's bytes/s, said so in the JSON
    assert data["input"]["inter_bw"] == 10e9 / 8 and data["input"]["intra_bw"] == 400e9 / 8
    assert data["units"]["intra_bw, inter_bw, inter_bw_for"] == "bytes/s"
    rc, out, err = run_cli(["plan", "--walltime", "--params", "10B", "--chips", "1e4",
                            "--inter-bandwidth", "100Gbit", "--compression", "int8", "--json"])
    assert rc == 0, err
    assert json.loads(out)["input"]["inter_bw"] == 100e9 / 8
    assert json.loads(out)["input"]["bytes_per_param"] == 1
    rc, out, err = run_cli(["plan", "--walltime", "--params", "10B"])
    assert rc == 0, err
    assert "Data-Parallel" in out and "appendix A" in out
    assert "between 10 Gbit/s" in out and "16 bits a parameter" in out


def test_the_docs_10b_case_in_bits_per_second(tmp_path, monkeypatch):
    # docs/scaling.md's comparison with Table 6: 10B Chinchilla, 0.8 s a step, outer only
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(["plan", "--walltime", "--params", "10B", "--chips", "1e3",
                            "--replicas", "1000", "--intra-latency", "0", "--H", "100"])
    assert rc == 0, err
    need = out.split("compute utilisation of:")[1]  # label, then 50/80/90/95/99%
    rows = {cells[0]: cells[1:] for cells in
            (re.split(r"\s{2,}", line.strip()) for line in need.splitlines()[2:])}
    assert rows["Data-Parallel"][0] == "405 Gbit/s" and rows["Data-Parallel"][2] == "4.05 Tbit/s"
    assert rows["DiLoCo M=1000, H=100"][0] == "4 Gbit/s"
    assert rows["DiLoCo M=1000, H=100"][2] == "36 Gbit/s"
