"""examples/decoupled_diloco.py: Decoupled DiLoCo's merge (a quorum, a grace window, a
tokens × speed weighted mean, outer Nesterov) pinned by hand on a one-number model, and
a run that trains, replays and resumes bit for bit."""

from pathlib import Path

import pytest

from fedlm import servers
from fedlm.sim import fleet
from fedlm.strategies import registry
from fedlm.strategies.base import Update
from tests.conftest import tiny_config
from tests.support import scalar as _p, trains_replays_and_resumes, value as _v

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _u(worker: int, g: float, tokens: int, steps: int) -> Update:
    return Update(worker=worker, job_id=0, base_version=0, outer_grad=_p(g), tokens=tokens,
                  local_steps=steps, staleness=0)


def test_a_quorum_merge_weights_tokens_by_speed_and_the_grace_window_joins_it():
    from decoupled_diloco import DecoupledMerge

    s = DecoupledMerge(quorum=2)  # lr 0.7, Nesterov 0.9
    s.set_speeds([1.0, 0.5, 0.25])  # steps a second
    s.start(_p(1.0), num_workers=3)
    # weight a = tokens × (tokens / steps) × speed
    assert s.on_update(_u(0, 0.2, tokens=2, steps=1), _p(1.0)) is None  # a = 4
    assert s.on_update(_u(0, 0.4, tokens=2, steps=1), _p(1.0)) is None  # one worker yet: a = 4
    merged = s.on_update(_u(2, 0.8, tokens=4, steps=2), _p(1.0))  # a = 4·2·0.25 = 2
    mean = (4 * 0.2 + 4 * 0.4 + 2 * 0.8) / 10  # 0.4
    assert _v(merged) == pytest.approx(1.0 - 0.7 * (0.9 * mean + mean))  # m = Δ: 0.468
    # before anyone gets new work, a late update joins the merge: made again from θ = 1, m = 0
    late = s.on_update(_u(1, 0.5, tokens=2, steps=2), merged)  # a = 2·1·0.5 = 1
    mean = (4 * 0.2 + 4 * 0.4 + 2 * 0.8 + 1 * 0.5) / 11
    assert _v(late) == pytest.approx(1.0 - 0.7 * 1.9 * mean)
    m = mean
    s.on_dispatch(0, version=1)  # the window is over: the next merge starts afresh
    assert s.on_update(_u(1, 0.1, tokens=2, steps=2), late) is None
    nxt = s.on_update(_u(2, 0.3, tokens=4, steps=2), late)
    mean = (1 * 0.1 + 2 * 0.3) / 3
    m = 0.9 * m + mean
    assert _v(nxt) == pytest.approx(_v(late) - 0.7 * (0.9 * m + mean))
    assert s.merges == 2


def test_a_retired_worker_no_longer_counts_towards_the_quorum():
    from decoupled_diloco import DecoupledMerge

    s = DecoupledMerge(quorum=3, lr=1.0, momentum=0.0)
    s.start(_p(1.0), num_workers=3)  # no SpeedServer: every worker alike
    assert s.on_update(_u(0, 0.2, tokens=1, steps=1), _p(1.0)) is None
    assert s.on_update(_u(1, 0.4, tokens=1, steps=1), _p(1.0)) is None
    merged = s.on_job_lost(2, job_id=5, reason="retired", params=_p(1.0))
    assert _v(merged) == pytest.approx(1.0 - 0.3) and not s.wants_job(2, version=1)


def test_its_server_hands_the_strategy_each_workers_speed():
    cfg = tiny_config("strategy=decoupled_diloco:DecoupledMerge", "fleet.step_times=[1, 2, 4]")
    server = servers.build(cfg, registry.build_strategy(cfg.strategy, cfg.outer))
    server.start(_p(0.0), fleet.node_profiles(cfg))
    assert server.strategy.speeds == [1.0, 0.5, 0.25]


def test_a_decoupled_run_trains_replays_and_resumes_bit_for_bit(tmp_path):
    trains_replays_and_resumes(tmp_path, "strategy=decoupled_diloco:DecoupledMerge",
                               "grace=adaptive", "outer.quorum=2")
