"""The chain's own pieces: staleness weighting, the buffer, stopping at None, and
async strategies that are their chain and nothing else."""

from collections import OrderedDict

import pytest
import torch

from fedlm.strategies import transforms as T
from fedlm.strategies.async_base import AsyncStrategy
from fedlm.strategies.base import Update
from fedlm.strategies.fedbuff import FedBuff
from fedlm.strategies.poly import Poly, PolyThres
from fedlm.strategies.traits import traits
from fedlm.strategies.registry import STRATEGIES


def tree(seed):
    g = torch.Generator().manual_seed(seed)
    return OrderedDict(w=torch.randn(7, 5, generator=g), b=torch.randn(5, generator=g))


def info(staleness):
    return Update(worker=0, job_id=0, base_version=0, outer_grad=None, tokens=1,
                  local_steps=1, staleness=staleness)


def equal(a, b):
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_weight_by_staleness_is_the_old_single_multiply_bit_for_bit():
    weight = Poly(a=0.5).staleness_weight
    for s, n in [(0, 4), (3, 4), (7, 3), (12, 5)]:
        wbs = T.weight_by_staleness(weight, divide_by=n)
        g = tree(s)
        out, state = wbs.update(g, wbs.init(g), info(s))
        # what AsyncStrategy computed before the chain did: v * (weight / num_workers)
        equal(out, OrderedDict((k, v * (weight(s) / n)) for k, v in g.items()))
        assert state == {"dropped": 0}


def test_weight_by_staleness_drops_on_none_and_counts_it():
    wbs = T.weight_by_staleness(PolyThres(threshold=2).staleness_weight, divide_by=3)
    g = tree(0)
    state = wbs.init(g)
    out, state = wbs.update(g, state, info(3))
    assert out is None and state == {"dropped": 1}
    out, state = wbs.update(g, state, info(2))
    assert out is not None and state == {"dropped": 1}
    out, state = wbs.update(g, state, info(9))
    assert out is None and state == {"dropped": 2}


def test_buffer_holds_then_emits_the_fifo_mean():
    buf = T.buffer(3)
    gs = [tree(k) for k in range(7)]
    state = buf.init(gs[0])
    for block in (gs[0:3], gs[3:6]):
        for g in block[:-1]:
            out, state = buf.update(g, state, None)
            assert out is None
        out, state = buf.update(block[-1], state, None)
        equal(out, T.weighted_mean(block, [1.0] * 3))  # FedBuff's mean, oldest first
        torch.testing.assert_close(out["w"], sum(g["w"] for g in block) / 3)
        assert state == {"buffer": []}
    out, state = buf.update(gs[6], state, None)
    assert out is None and len(state["buffer"]) == 1


def spy() -> T.Transform:
    """Counts its calls in its state and passes the gradient on."""
    return T.Transform(lambda params: {"calls": 0},
                       lambda g, s, info: (g, {"calls": s["calls"] + 1}))


def test_chain_stops_at_the_first_none_and_keeps_the_later_states():
    opt = T.chain(spy(), T.buffer(2), spy(), T.scale(2.0))
    g = tree(0)
    state = opt.init(g)
    step, state = opt.update(g, state, None)
    assert step is None
    assert state[0] == {"calls": 1} and len(state[1]["buffer"]) == 1 and state[2] == {"calls": 0}
    step, state = opt.update(tree(1), state, None)
    assert step is not None
    assert state[0] == {"calls": 2} and state[1] == {"buffer": []} and state[2] == {"calls": 1}
    equal(step, T.tree_map(lambda m: m * 2.0, T.weighted_mean([g, tree(1)], [1.0, 1.0])))


def test_a_dropped_update_leaves_the_rest_of_the_chain_alone():
    q = PolyThres(threshold=1)
    theta = tree(0)
    q.start(theta, num_workers=2)
    before = q.opt_state[1]
    assert q.on_update(Update(0, 0, 0, tree(1), 1, 1, staleness=2), theta) is None
    assert q.dropped == 1 and q.applied == 0 and q.opt_state[1] is before


@pytest.mark.parametrize("name", sorted(n for n, c in STRATEGIES.items()
                                         if not traits(c).synchronous))
def test_async_strategies_are_their_chain(name):
    cls = STRATEGIES[name]
    assert issubclass(cls, AsyncStrategy) and cls.on_update is AsyncStrategy.on_update


def test_halos_levels_are_delayed_nesterov_chains():
    """halos's region servers and its global server each step with an instance of it
    (fedlm.servers.regions; tests/test_halos.py: one region is flat DN exactly), which
    is the delayed-Nesterov strategy with that level's settings (the old spelling,
    outer.global_*, read as server.global_outer)."""
    from fedlm.strategies.delayed_nesterov import DelayedNesterov
    from fedlm.strategies.registry import build_strategy
    from tests.conftest import tiny_config

    cfg = tiny_config("strategy=halos", "outer.lr=0.3", "outer.momentum=0.8",
                      "outer.buffer_size=3", "outer.global_lr=0.5",
                      "outer.global_momentum=0.4", "outer.global_buffer_size=2")
    theta = tree(0)
    for level, dn in ((build_strategy("halos", cfg.outer),
                       DelayedNesterov(lr=0.3, momentum=0.8, buffer_size=3)),
                      (build_strategy("halos", {**cfg.outer,
                                                **cfg.server.settings["global_outer"]}),
                       DelayedNesterov(lr=0.5, momentum=0.4, buffer_size=2))):
        level.start(theta, num_workers=5)
        dn.start(theta, num_workers=5)
        for k in range(5):
            u = Update(0, k, 0, tree(k + 1), 1, 1, staleness=0)
            a, b = level.on_update(u, theta), dn.on_update(u, theta)
            assert all(torch.equal(a[n], b[n]) for n in a)


def test_fedbuff_buffer_reads_the_chain_state():
    fb = FedBuff(lr=1.0, momentum=0.0, buffer_size=2)
    theta = tree(0)
    fb.start(theta, num_workers=4)
    assert fb.on_update(Update(1, 0, 0, tree(1), 1, 1, staleness=3), theta) is None
    (held,) = fb.buffer
    equal(held, OrderedDict((k, v * (0.5 / 1)) for k, v in tree(1).items()))
