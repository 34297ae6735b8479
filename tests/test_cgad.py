"""examples/cgad.py: CGAD's age weight σ(τ) = γ(τ)·e^(−ατ) before an outer Adam, pinned by
hand on a one-number model, and a run that trains, replays and resumes bit for bit."""

import math
from pathlib import Path

import pytest

from fedlm.strategies.base import Update
from tests.support import scalar as _p, trains_replays_and_resumes, value as _v

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _u(g: float, staleness: int) -> Update:
    return Update(worker=0, job_id=0, base_version=0, outer_grad=_p(g), tokens=1,
                  local_steps=1, staleness=staleness)


def test_the_age_weight_is_one_when_fresh_decays_and_closes_at_the_cutoff():
    from cgad import age_weight

    assert age_weight(0, 0.1, 10) == 1.0
    assert age_weight(5, 0.1, 10) == pytest.approx(0.5 * math.exp(-0.5))  # γ(5) = ½(1 + cos π/2)
    assert age_weight(10, 0.1, 10) == age_weight(30, 0.1, 10) == 0.0


def test_each_arrival_enters_adams_moments_weighted_by_its_age_in_rounds():
    """N = 2 workers: an age of s versions is s / 2 outer rounds, and each arrival takes
    lr / 2 (the paper's Adam steps once a round)."""
    from cgad import CGAD

    s = CGAD(lr=0.1, beta1=0.5, beta2=0.75, alpha=0.1, cutoff=10)
    s.start(_p(1.0), num_workers=2)
    # fresh: plain Adam's first step, m̂ = g, v̂ = g², a step of lr / N
    theta = s.on_update(_u(0.4, 0), _p(1.0))
    assert _v(theta) == pytest.approx(1.0 - 0.05 * 0.4 / (0.4 + 1e-8))
    # staleness 10 = 5 rounds: g̃ = ½e^(−0.5)·0.2 enters both moments
    g = 0.5 * math.exp(-0.5) * 0.2
    m, v = 0.5 * 0.2 + 0.5 * g, 0.75 * 0.04 + 0.25 * g * g
    step = 0.05 * (m / 0.75) / (math.sqrt(v / (1 - 0.75 ** 2)) + 1e-8)
    before, theta = _v(theta), s.on_update(_u(0.2, 10), theta)
    assert _v(theta) == pytest.approx(before - step)
    # staleness 24 = 12 rounds, past the cutoff: σ = 0, the moments decay, m moves it
    m, v = 0.5 * m, 0.75 * v
    step = 0.05 * (m / (1 - 0.5 ** 3)) / (math.sqrt(v / (1 - 0.75 ** 3)) + 1e-8)
    before, theta = _v(theta), s.on_update(_u(5.0, 24), theta)
    assert _v(theta) == pytest.approx(before - step)


def test_fresh_updates_are_plain_adam_as_the_paper_says():
    """The paper: CGAD "reduces to plain Adam at τ = 0". Fresh arrivals only (a worker
    alone): the steps are torch's Adam's (at lr / N, N = 1), to the last bit of float32."""
    import torch
    from collections import OrderedDict
    from cgad import CGAD

    grads = [0.3, -0.1, 0.7, 0.2, -0.5]
    s = CGAD(lr=0.01, beta1=0.9, beta2=0.99)
    theta = OrderedDict(w=torch.tensor([1.0]))
    s.start(theta, num_workers=1)
    ref = torch.nn.Parameter(torch.tensor([1.0]))
    adam = torch.optim.Adam([ref], lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    for g in grads:
        theta = s.on_update(Update(worker=0, job_id=0, base_version=0,
                                   outer_grad=OrderedDict(w=torch.tensor([g])), tokens=1,
                                   local_steps=1, staleness=0), theta)
        ref.grad = torch.tensor([g])
        adam.step()
    torch.testing.assert_close(theta["w"], ref.detach(), rtol=1e-6, atol=1e-7)


def test_a_cgad_run_trains_replays_and_resumes_bit_for_bit(tmp_path):
    trains_replays_and_resumes(tmp_path, "strategy=cgad:CGAD", "fleet.preset=very")
