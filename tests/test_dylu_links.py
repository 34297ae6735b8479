"""DyLU sizes whole jobs (transfers + compute), and the adaptive window knows when it can't."""

import math

import numpy as np
import pytest

from fedlm.engine.grace import AdaptiveGrace, NoGrace, grace_for
from fedlm.strategies.local_steps import DyLU, DyLUOnline
from tests.conftest import tiny_config


def _dylu(step_times, transfers=None, steps=20, cls=DyLU):
    policy = cls()
    policy.start(steps=steps, step_times=step_times, transfer_times=transfers)
    return policy


def test_with_equal_links_it_is_the_papers_rule_bit_for_bit():
    rng = np.random.default_rng(0)
    for _ in range(200):
        times = list(rng.uniform(0.1, 5.0, size=6))
        steps = int(rng.integers(1, 60))
        x = float(rng.uniform(0, 30))
        paper = [max(1, math.floor(1 / t / max(1 / u for u in times) * steps + 0.5))
                 for t in times]
        for transfers in (None, [x] * 6):
            policy = _dylu(times, transfers, steps)
            assert [policy.local_steps(w) for w in range(6)] == paper
            assert policy.sizes_even()


def test_whole_jobs_end_together_and_a_worker_held_at_one_step_is_said():
    times, transfers = [1.0, 1.0, 2.0, 0.5], [2.0, 12.0, 4.0, 30.0]
    policy = _dylu(times, transfers, steps=20)
    target = min(x + 20 * t for t, x in zip(times, transfers))  # worker 0: 22 s
    steps = [policy.local_steps(w) for w in range(4)]
    assert steps == [20, 10, 9, 1]
    for w in range(3):  # each whole job within half a step of the target
        assert abs(transfers[w] + steps[w] * times[w] - target) <= times[w] / 2
    assert not policy.sizes_even()  # worker 3's transfers alone outlast the target
    assert _dylu(times, transfers[:3] + [15.0], steps=20).sizes_even()


def test_the_adaptive_window_is_off_where_dylu_cannot_even_jobs_out():
    cfg = tiny_config("strategy=delayed-nesterov", "local_steps=dylu")
    from fedlm.strategies import registry
    from fedlm.sim import fleet

    strategy = registry.build_strategy(cfg.strategy, cfg.outer)
    profiles = fleet.node_profiles(cfg)
    times = [p.step_time for p in profiles]
    even = _dylu(times, [1.0] * len(times))
    uneven = _dylu(times, [0.0, 0.0, 1e6][:len(times)])
    assert isinstance(grace_for(cfg, strategy, even, profiles), AdaptiveGrace)
    assert isinstance(grace_for(cfg, strategy, uneven, profiles), NoGrace)


def test_dylu_online_learns_transfers_from_the_jobs():
    policy = _dylu([1.0, 1.0], None, steps=10, cls=DyLUOnline)
    for _ in range(3):
        policy.observe(0, steps=10, seconds=10.0, transfer=1.0)
        policy.observe(1, steps=5, seconds=5.0, transfer=6.0)
    assert policy.reference() == (pytest.approx(1.0), 1.0)
    assert [policy.local_steps(w) for w in range(2)] == [10, 5]
    state = policy.state_dict()
    again = DyLUOnline()
    again.load_state_dict(state)
    assert [again.local_steps(w) for w in range(2)] == [10, 5]
