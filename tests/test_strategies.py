"""The outer optimizers pinned with closed forms, on tensors alone."""

from collections import OrderedDict

import pytest
import torch

from fedlm.strategies import transforms as T
from fedlm.strategies.base import Update
from fedlm.strategies.diloco import DiLoCo
from fedlm.strategies.fedavg import FedAvg
from fedlm.strategies.registry import STRATEGIES
from fedlm.strategies.traits import traits


def params(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return OrderedDict(w=torch.randn(3, 4, generator=g), b=torch.randn(4, generator=g))


def update(worker, grad, tokens=100, base=0):
    return Update(worker=worker, job_id=worker, base_version=base, outer_grad=grad,
                  tokens=tokens, local_steps=5, staleness=0)


def run_round(strategy, theta, grads, tokens=None):
    tokens = tokens or [100] * len(grads)
    for w in range(len(grads)):
        assert strategy.wants_job(w, version=0)
        strategy.on_dispatch(w, version=0)
    out = None
    for w in reversed(range(len(grads))):  # arrival order must not matter
        out = strategy.on_update(update(w, grads[w], tokens[w]), theta)
        if w > 0:
            assert out is None, "the barrier must hold until the last worker"
    return out


def test_nesterov_transform_matches_the_papers_form():
    beta, lr = 0.9, 0.7
    opt = T.sgd(lr, beta, nesterov=True)
    g1, g2 = params(1), params(2)
    state = opt.init(g1)
    s1, state = opt.update(g1, state, None)
    s2, state = opt.update(g2, state, None)
    m1 = g1["w"]
    m2 = beta * m1 + g2["w"]
    torch.testing.assert_close(s1["w"], lr * (beta * m1 + g1["w"]))
    torch.testing.assert_close(s2["w"], lr * (beta * m2 + g2["w"]))
    # equivalently ε(β² m_old + (1 + β) g)
    torch.testing.assert_close(s2["w"], lr * (beta ** 2 * m1 + (1 + beta) * g2["w"]))


def test_fedavg_at_lr_one_is_the_token_weighted_average_of_worker_models():
    theta = params(0)
    workers = [params(10 + k) for k in range(3)]
    tokens = [100, 300, 600]
    grads = [OrderedDict((n, theta[n] - wk[n]) for n in theta) for wk in workers]
    s = FedAvg()
    s.start(theta, num_workers=3)
    new = run_round(s, theta, grads, tokens)
    for n in theta:
        expected = sum(t * wk[n] for t, wk in zip(tokens, workers)) / sum(tokens)
        torch.testing.assert_close(new[n], expected)


def test_diloco_with_lr_one_and_no_momentum_is_fedavg():
    theta = params(0)
    grads = [params(20 + k) for k in range(4)]
    a, b = FedAvg(), DiLoCo(lr=1.0, momentum=0.0)
    a.start(theta, num_workers=4)
    b.start(theta, num_workers=4)
    ta, tb = theta, theta
    for _ in range(3):  # several rounds: no hidden state may differ
        ta, tb = run_round(a, ta, grads), run_round(b, tb, grads)
        for n in theta:
            torch.testing.assert_close(ta[n], tb[n], rtol=0, atol=0)


def test_diloco_defaults_are_the_papers_and_step_is_nesterov_on_the_mean():
    d = DiLoCo()
    assert (d.lr, d.momentum, d.nesterov) == (0.7, 0.9, True)
    theta = params(0)
    grads = [params(30 + k) for k in range(2)]
    d.start(theta, num_workers=2)
    new = run_round(d, theta, grads)
    mean = (grads[0]["w"] + grads[1]["w"]) / 2
    torch.testing.assert_close(new["w"], theta["w"] - 0.7 * (0.9 * mean + mean))


def test_uniform_weighting_ignores_tokens():
    theta = params(0)
    grads = [params(40), params(41)]
    s = FedAvg(weighting="uniform")
    s.start(theta, num_workers=2)
    new = run_round(s, theta, grads, tokens=[1, 1000])
    torch.testing.assert_close(new["b"], theta["b"] - (grads[0]["b"] + grads[1]["b"]) / 2)


def test_sync_worker_gets_one_job_per_round():
    s = FedAvg()
    s.start(params(0), num_workers=2)
    s.on_dispatch(0, version=0)
    assert not s.wants_job(0, version=0) and s.wants_job(1, version=0)


@pytest.mark.parametrize("name", sorted(n for n, c in STRATEGIES.items()
                                         if traits(c).synchronous))
def test_sync_state_round_trip_continues_identically(name, tmp_path):
    theta = params(0)
    grads = [params(50 + k) for k in range(3)]
    a = STRATEGIES[name]()
    a.start(theta, num_workers=3)
    theta = run_round(a, theta, grads)
    torch.save(a.state_dict(), tmp_path / "s.pt")
    b = STRATEGIES[name]()
    b.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=False))
    ta, tb = run_round(a, theta, grads), run_round(b, theta, grads)
    for n in theta:
        assert torch.isfinite(ta[n]).all()
        torch.testing.assert_close(ta[n], tb[n], rtol=0, atol=0)


def test_constructor_refuses_bad_settings():
    with pytest.raises(ValueError, match="outer.lr"):
        FedAvg(lr=0)
    with pytest.raises(ValueError, match="outer.weighting"):
        DiLoCo(weighting="speed")


def test_every_strategy_and_policy_says_whether_it_follows_its_paper():
    """`fedlm strategies` tells a user which rules are a paper's as the paper states them,
    which are reconstructions (and what was chosen), and which are fedlm's own."""
    from fedlm.strategies import registry

    kinds = ("follows ", "reconstruction of ", "fedlm's own", "fedlm's extension of ",
             "the paper's ")
    for name, kind, _, source in registry.describe():
        if kind != "plugin":
            assert source.startswith(kinds), (name, source)


def test_every_example_plugin_says_whether_it_follows_its_paper(capsys):
    from pathlib import Path

    from fedlm.cli import main

    folder = Path(__file__).resolve().parent.parent / "examples"
    assert main(["strategies"]) == 0
    out = capsys.readouterr().out.split("plug-ins in this checkout's examples/")[1]
    for path in sorted(folder.glob("*.py")):
        line = next(x for x in out.splitlines() if x.startswith(path.stem + " "))
        assert line.split(None, 1)[1].startswith(("follows ", "reconstruction", "fedlm's own")), line
