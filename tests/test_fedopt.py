"""examples/fedopt.py: Flower's FedOpt family as FedAvg subclasses of a few lines, each
rule pinned by hand on a one-number model over two rounds (Reddi et al. 2021, Alg. 2:
m ← β₁m + (1 − β₁)g; Adam v ← β₂v + (1 − β₂)g², Yogi v ← v − (1 − β₂)g²·sign(v − g²),
Adagrad v ← v + g²; x ← x − η·m/(√v + τ), v from τ²), and a run that trains, replays and
resumes bit for bit."""

import math
from pathlib import Path

import pytest

from fedlm.strategies.base import Update
from tests.support import scalar as _p, trains_replays_and_resumes, value as _v

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _round(s, x: float, grads: dict[int, float], tokens: dict[int, int]) -> float:
    for w in grads:
        assert s.wants_job(w, version=0)
        s.on_dispatch(w, version=0)
    out = None
    for w, g in grads.items():
        out = s.on_update(Update(worker=w, job_id=0, base_version=0, outer_grad=_p(g),
                                 tokens=tokens[w], local_steps=1, staleness=0), _p(x))
    return _v(out)


def _adaptive(second: str, gs: list[float], lr: float, b1: float, b2: float, tau: float):
    """The paper's rule by hand: the model after each of the rounds' merged gradients."""
    m, v, x, out = 0.0, tau * tau, 1.0, []
    for g in gs:
        m = b1 * m + (1 - b1) * g
        if second == "adam":
            v = b2 * v + (1 - b2) * g * g
        elif second == "yogi":
            v = v - (1 - b2) * g * g * math.copysign(1.0, v - g * g)
        else:
            v = v + g * g
        x -= lr * m / (math.sqrt(v) + tau)
        out.append(x)
    return out


@pytest.mark.parametrize("name, second, lr, b1", [
    ("FedAdam", "adam", 0.1, 0.9), ("FedYogi", "yogi", 0.01, 0.9),
    ("FedAdagrad", "adagrad", 0.1, 0.0)])
def test_each_adaptive_rule_by_hand_on_the_rounds_token_weighted_mean(name, second, lr, b1):
    import fedopt

    s = getattr(fedopt, name)()  # Flower's defaults
    assert (s.lr, s.beta1, s.beta2, s.tau) == (lr, b1, 0.99, 1e-3)
    s.start(_p(1.0), num_workers=2)
    tokens = {0: 3, 1: 1}
    g1, g2 = (3 * 0.4 + 1 * 0.8) / 4, (3 * -0.1 + 1 * 0.3) / 4  # 0.5, then 0.0
    want = _adaptive(second, [g1, g2, 0.2], lr, b1, 0.99, 1e-3)
    x = _round(s, 1.0, {0: 0.4, 1: 0.8}, tokens)
    assert x == pytest.approx(want[0], rel=1e-6)
    x = _round(s, x, {0: -0.1, 1: 0.3}, tokens)
    assert x == pytest.approx(want[1], rel=1e-6)
    x = _round(s, x, {0: 0.2, 1: 0.2}, tokens)
    assert x == pytest.approx(want[2], rel=1e-6)
    assert second in s.summary() and "SGD" not in s.summary()


def test_fedavgm_is_heavy_ball_server_momentum():
    from fedopt import FedAvgM

    s = FedAvgM()  # lr 1, β 0.9
    s.start(_p(1.0), num_workers=1)
    x = _round(s, 1.0, {0: 0.5}, {0: 1})  # v = 0.5
    assert x == pytest.approx(0.5)
    x = _round(s, x, {0: 0.2}, {0: 1})  # v = 0.9·0.5 + 0.2 = 0.65
    assert x == pytest.approx(-0.15)


def test_a_fedadam_run_trains_replays_and_resumes_bit_for_bit(tmp_path):
    trains_replays_and_resumes(tmp_path, "strategy=fedopt:FedAdam")
