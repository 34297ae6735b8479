"""Async strategies and local-steps policies pinned with closed forms."""

import math
import random
from collections import OrderedDict

import pytest
import torch

from fedlm.strategies import transforms as T
from fedlm.strategies.async_nesterov import AsyncNesterov
from fedlm.strategies.async_sgd import AsyncSGD
from fedlm.strategies.base import Update
from fedlm.strategies.delayed_nesterov import DelayedNesterov
from fedlm.strategies.fedbuff import FedBuff
from fedlm.strategies.local_steps import DyLU, DyLUFloor, DyLUOnline
from fedlm.strategies.poly import Poly, PolyThres


def tree(seed):
    g = torch.Generator().manual_seed(seed)
    return OrderedDict(w=torch.randn(5, 3, generator=g, dtype=torch.float64),
                       b=torch.randn(3, generator=g, dtype=torch.float64))


def upd(grad, staleness=0, worker=0):
    return Update(worker=worker, job_id=0, base_version=0, outer_grad=grad, tokens=1,
                  local_steps=1, staleness=staleness)


def close(a, b):
    for k in a:
        torch.testing.assert_close(a[k], b[k])


def test_dn_with_buffer_one_is_nesterov():
    dn = T.delayed_nesterov(0.9, buffer_size=1)
    nest = T.trace(0.9, nesterov=True)
    g0 = tree(0)
    s1, s2 = dn.init(g0), nest.init(g0)
    for k in range(5):
        a, s1 = dn.update(tree(k), s1, None)
        b, s2 = nest.update(tree(k), s2, None)
        close(a, b)


@pytest.mark.parametrize("n", [2, 4])
def test_dn_c0_over_n_pushes_is_one_nesterov_step_on_the_mean(n):
    beta, lr = 0.9, 0.7
    theta0 = tree(100)
    dn = DelayedNesterov(lr=lr, momentum=beta, buffer_size=n)
    dn.start(theta0, num_workers=n)
    ref = T.sgd(lr, beta, nesterov=True)
    ref_state = ref.init(theta0)
    theta, ref_theta = theta0, theta0
    for block in range(3):  # several blocks: momentum carries over correctly
        grads = [tree(10 * block + k) for k in range(n)]
        for g in grads:
            theta = dn.on_update(upd(g), theta)
        mean = OrderedDict((k, sum(g[k] for g in grads) / n) for k in theta0)
        step, ref_state = ref.update(mean, ref_state, None)
        ref_theta = T.descend(ref_theta, step)
        close(theta, ref_theta)


def test_dn_with_c_follows_algorithm_3():
    beta, lr, n, c = 0.9, 0.5, 2, 0.25
    dn = T.chain(T.delayed_nesterov(beta, n, c), T.scale(lr))
    g = [tree(k) for k in range(4)]
    state = dn.init(g[0])
    steps = []
    for gi in g:
        s, state = dn.update(gi, state, None)
        steps.append(s)
    m = {k: torch.zeros_like(v) for k, v in g[0].items()}
    for k in g[0]:
        # push 0: no momentum update, m = 0
        torch.testing.assert_close(steps[0][k], lr * g[0][k] / n)
        m1 = beta * 0 + (g[0][k] + g[1][k]) / n
        torch.testing.assert_close(steps[1][k], lr * ((1 - c * n + c) * beta * m1 + g[1][k] / n))
        torch.testing.assert_close(steps[2][k], lr * (c * beta * m1 + g[2][k] / n))
        m2 = beta * m1 + (g[2][k] + g[3][k]) / n
        torch.testing.assert_close(steps[3][k], lr * ((1 - c * n + c) * beta * m2 + g[3][k] / n))
    del m


def test_dn_refuses_c_above_one_over_n():
    with pytest.raises(ValueError, match="outer.c"):
        T.delayed_nesterov(0.9, 4, c=0.5)


def test_async_sgd_and_naive_nesterov_apply_every_update_scaled_by_n():
    theta = tree(1)
    s = AsyncSGD(lr=0.5)
    s.start(theta, num_workers=4)
    g = tree(2)
    close(s.on_update(upd(g), theta), {k: theta[k] - 0.5 * g[k] / 4 for k in theta})
    a = AsyncNesterov(lr=0.7, momentum=0.9)
    a.start(theta, num_workers=2)
    new = a.on_update(upd(g), theta)
    close(new, {k: theta[k] - 0.7 * (0.9 * g[k] / 2 + g[k] / 2) for k in theta})


def test_poly_weights_match_hand_computed_values():
    p = Poly(a=0.5)
    assert p.staleness_weight(0) == 1.0
    assert p.staleness_weight(3) == pytest.approx(0.5)
    assert p.staleness_weight(8) == pytest.approx(1 / 3)
    q = PolyThres(a=0.5, threshold=10)
    assert q.staleness_weight(10) == pytest.approx(11 ** -0.5)
    assert q.staleness_weight(11) is None
    theta = tree(0)
    q.start(theta, num_workers=1)
    assert q.on_update(upd(tree(1), staleness=11), theta) is None and q.dropped == 1
    sgd_poly = Poly(lr=1.0, momentum=0.0, a=0.5)
    sgd_poly.start(theta, num_workers=1)
    g = tree(3)
    close(sgd_poly.on_update(upd(g, staleness=3), theta), {k: theta[k] - 0.5 * g[k] for k in g})


def test_fedbuff_averages_k_scaled_updates_then_steps_once():
    theta = tree(0)
    fb = FedBuff(lr=1.0, momentum=0.0, buffer_size=3)
    fb.start(theta, num_workers=5)
    gs, stal = [tree(k) for k in (1, 2, 3)], [0, 3, 8]
    assert fb.on_update(upd(gs[0], stal[0]), theta) is None
    assert fb.on_update(upd(gs[1], stal[1]), theta) is None
    new = fb.on_update(upd(gs[2], stal[2]), theta)
    weights = [1.0, 0.5, 1 / 3]  # 1/sqrt(1+s)
    expected = {k: theta[k] - sum(w * g[k] for w, g in zip(weights, gs)) / 3 for k in theta}
    close(new, expected)
    assert fb.buffer == []


def test_dylu_follows_its_formula_rounded_to_the_nearest_step():
    times = (0.58, 0.75, 1.51, 3.33, 1000.0)
    v = [1 / t for t in times]
    d = DyLU()
    d.start(steps=50, step_times=list(times))
    hs = [d.local_steps(w) for w in range(5)]
    assert hs == [max(1, math.floor(x / max(v) * 50 + 0.5)) for x in v] == [50, 39, 19, 9, 1]
    floor = DyLUFloor()
    floor.start(steps=50, step_times=list(times))
    assert [floor.local_steps(w) for w in range(5)] == [
        max(1, math.floor(x / max(v) * 50)) for x in v] == [50, 38, 19, 8, 1]
    # the toy notebook's speeds at H = 20: floor 20/15/7/3 (the paper), nearest 20/15/8/3
    for policy, want in ((DyLUFloor(), [20, 15, 7, 3]), (DyLU(), [20, 15, 8, 3])):
        policy.start(steps=20, step_times=list(times[:4]))
        assert [policy.local_steps(w) for w in range(4)] == want


def test_dylu_online_is_robust_to_one_slow_measurement():
    d = DyLUOnline()
    d.start(steps=40, step_times=[1.0, 1.0, 1.0])
    assert [d.local_steps(w) for w in range(3)] == [40, 40, 40]  # nothing observed yet
    for _ in range(4):
        d.observe(0, steps=10, seconds=10.0)  # 1 s/step
        d.observe(1, steps=10, seconds=20.0)  # 2 s/step
    d.observe(0, steps=10, seconds=500.0)  # one hiccup of the fastest worker
    assert d.local_steps(0) == 40
    assert d.local_steps(1) == 20
    assert d.local_steps(2) == 40  # unobserved: assumed as fast as the fastest


@pytest.mark.parametrize("cls", [DyLU, DyLUFloor, DyLUOnline])
def test_dylu_answers_each_job_as_its_formula_over_the_whole_fleet_would(cls):
    """A job's H comes from the fastest speed kept as it changes, not from a pass over
    every worker per job; the answers, and the checkpointed state, are the formula's."""
    rng = random.Random(3)
    times = [rng.uniform(0.5, 4.0) for _ in range(40)]
    d, fresh = cls(), cls()
    d.start(steps=30, step_times=times)
    keys = set(d.state_dict())
    assert keys == ({"steps", "step_times", "transfer_times", "observed", "observed_transfer"}
                    if cls is DyLUOnline else {"steps", "step_times", "transfer_times"})
    for i in range(2000):
        w = rng.randrange(40)
        v = d.speeds()
        assert d.local_steps(w) == max(1, d.round(v[w] / max(v) * 30)), i
        d.observe(w, steps=rng.randrange(0, 20), seconds=rng.choice([0.0, rng.uniform(1, 90)]))
        if i % 500 == 250:  # a checkpoint, resumed into a new policy
            fresh.start(steps=30, step_times=times)
            fresh.load_state_dict(d.state_dict())
            assert set(fresh.state_dict()) == keys
            d, fresh = fresh, cls()
