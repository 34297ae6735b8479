"""examples/heloco.py: HeLoCo's direction-aware correction of stale outer gradients
against the outer momentum, pinned on two-number models (each case by hand), and a run
that trains, replays and resumes bit for bit."""

import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedlm.strategies.base import Update
from tests.support import trains_replays_and_resumes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _vec(x: float, y: float) -> OrderedDict:
    return OrderedDict(w=torch.tensor([x, y], dtype=torch.float64))


def _u(x: float, y: float) -> Update:
    return Update(worker=0, job_id=0, base_version=0, outer_grad=_vec(x, y), tokens=1,
                  local_steps=1, staleness=3)


def _pair(t) -> tuple[float, float]:
    return float(t["w"][0]), float(t["w"][1])


def _norm(a):
    return math.hypot(*a)


def test_each_arrival_is_kept_shrunk_or_turned_against_the_momentum_then_stepped():
    """μ = 0.5, η = 1, ρ = 1: m ← μm + (1 − μ)G, θ ← θ − η(G + μm), each case by hand."""
    from heloco import HeLoCo

    s = HeLoCo(lr=1.0, momentum=0.5, c_ok=0.5, k_s=1.0, beta_max=0.5, k_d=1.0, kappa=1.0)
    s.start(_vec(0.0, 0.0), num_workers=1)  # ρ = 1/N = 1
    # 1. m = 0: nothing to compare with, Δ as it is; m = ½Δ, step = Δ + ½m
    theta = s.on_update(_u(1.0, 0.0), _vec(0.0, 0.0))
    assert _pair(theta) == pytest.approx((-1.25, 0.0))
    m = (0.5, 0.0)
    # 2. Δ = (−1, 1) against m = (½, 0): c = −1/√2 < 0, its component against m shrunk:
    #    conf = √2/(√2 + ½), β = min(1·(1/√2)·conf, ½), Δ̂ = Δ − β·c·‖Δ‖·m̂ = (−1 + β, 1)
    beta = min(math.sqrt(0.5) * math.sqrt(2.0) / (math.sqrt(2.0) + 0.5), 0.5)
    fixed = (-1.0 + beta, 1.0)
    m = tuple(0.5 * m[i] + 0.5 * fixed[i] for i in (0, 1))
    before, theta = _pair(theta), s.on_update(_u(-1.0, 1.0), theta)
    assert _pair(theta) == pytest.approx([before[i] - (fixed[i] + 0.5 * m[i]) for i in (0, 1)])
    # 3. Δ = (1, 0.5): 0 ≤ c < c_ok, turned towards m by λ = (1 − c)·conf, length kept
    d = (1.0, 0.5)
    c = (d[0] * m[0] + d[1] * m[1]) / (_norm(d) * _norm(m))
    assert 0 < c < 0.5
    lam = min((1 - c) * _norm(d) / (_norm(d) + _norm(m)), 1.0)
    turned = [(1 - lam) * d[i] / _norm(d) + lam * m[i] / _norm(m) for i in (0, 1)]
    fixed = [_norm(d) * t / _norm(turned) for t in turned]
    m = [0.5 * m[i] + 0.5 * fixed[i] for i in (0, 1)]
    before, theta = _pair(theta), s.on_update(_u(*d), theta)
    assert _pair(theta) == pytest.approx([before[i] - (fixed[i] + 0.5 * m[i]) for i in (0, 1)])
    assert s.opt_state["corrected"] == 2  # the second and third arrivals


def test_the_secondary_statements_worked_example():
    """Δ = (1, 1), m = (1, 0), κ = k_d = 1, c_ok = 0.8: c = 0.7071, conf = 0.5858,
    λ = 0.1716, Δ̂ = (1.1186, 0.8652) (zij's HeLoCo notes, the rule this file follows)."""
    from heloco import corrected

    got = corrected(torch.tensor([1.0, 1.0], dtype=torch.float64),
                    torch.tensor([1.0, 0.0], dtype=torch.float64),
                    c_ok=0.8, k_s=1, beta_max=1, k_d=1, kappa=1)
    assert [round(float(x), 4) for x in got] == [1.1186, 0.8652]


def test_an_aligned_arrival_is_kept_and_arrivals_count_one_nth():
    from heloco import HeLoCo, corrected

    d, m = torch.tensor([1.0, 0.2]), torch.tensor([1.0, 0.0])  # c = 0.98 ≥ c_ok
    assert corrected(d, m, c_ok=0.2, k_s=1, beta_max=1, k_d=1, kappa=1) is d
    s = HeLoCo(lr=1.0, momentum=0.5)
    s.start(_vec(0.0, 0.0), num_workers=4)
    # G = ¼Δ = (0.25, 0), m = ½G, step = G + ½m = 0.3125
    assert _pair(s.on_update(_u(1.0, 0.0), _vec(0.0, 0.0))) == pytest.approx((-0.3125, 0.0))


def test_a_heloco_run_trains_replays_and_resumes_bit_for_bit(tmp_path):
    # c_ok 0.9: most arrivals are corrected in so short a run
    trains_replays_and_resumes(tmp_path, "strategy=heloco:HeLoCo", "outer.c_ok=0.9",
                               "fleet.preset=very")
