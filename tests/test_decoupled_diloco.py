"""examples/decoupled_diloco.py: Decoupled DiLoCo's merge (a quorum, a grace window, a
tokens × tokens-per-step weighted mean or RDA, outer Nesterov) pinned by hand on a one-number model, and
a run that trains, replays and resumes bit for bit."""

from pathlib import Path

import pytest

from fedlm.errors import ConfigError
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


def test_a_quorum_merge_weights_tokens_by_tokens_per_step_and_the_grace_window_joins_it():
    from decoupled_diloco import DecoupledMerge

    s = DecoupledMerge(quorum=2, merge="mean")  # lr 0.7, Nesterov 0.9
    s.start(_p(1.0), num_workers=3)
    # weight a = tokens × (tokens / steps)
    assert s.on_update(_u(0, 0.2, tokens=2, steps=1), _p(1.0)) is None  # a = 4
    assert s.on_update(_u(0, 0.4, tokens=2, steps=1), _p(1.0)) is None  # one worker yet: a = 4
    merged = s.on_update(_u(2, 0.8, tokens=4, steps=2), _p(1.0))  # a = 4·2 = 8
    mean = (4 * 0.2 + 4 * 0.4 + 8 * 0.8) / 16  # 0.55
    assert _v(merged) == pytest.approx(1.0 - 0.7 * (0.9 * mean + mean))  # m = Δ
    # before anyone gets new work, a late update joins the merge: made again from θ = 1, m = 0
    late = s.on_update(_u(1, 0.5, tokens=2, steps=2), merged)  # a = 2·1 = 2
    mean = (4 * 0.2 + 4 * 0.4 + 8 * 0.8 + 2 * 0.5) / 18
    assert _v(late) == pytest.approx(1.0 - 0.7 * 1.9 * mean)
    m = mean
    s.on_dispatch(0, version=1)  # the window is over: the next merge starts afresh
    assert s.on_update(_u(1, 0.1, tokens=2, steps=2), late) is None
    nxt = s.on_update(_u(2, 0.3, tokens=4, steps=2), late)
    mean = (2 * 0.1 + 8 * 0.3) / 10
    m = 0.9 * m + mean
    assert _v(nxt) == pytest.approx(_v(late) - 0.7 * (0.9 * m + mean))
    assert s.merges == 2


def test_the_papers_weight_is_tokens_squared_over_steps_and_grows_once_with_speed():
    """w(100 tokens, 10 steps) = 1,000; w(0, 10) = 0; no steps, no weight. Under DyLU a
    worker twice as fast runs twice the steps of the same batch: twice the weight (this
    file's weight once multiplied by speed too: four times)."""
    from decoupled_diloco import DecoupledMerge

    w = DecoupledMerge.weight
    assert w(_u(0, 0.0, tokens=100, steps=10)) == 1000.0
    assert w(_u(0, 0.0, tokens=0, steps=10)) == 0.0 and w(_u(0, 0.0, tokens=5, steps=0)) == 0.0
    fast, slow = _u(0, 0.0, tokens=8 * 64, steps=8), _u(1, 0.0, tokens=4 * 64, steps=4)
    assert w(fast) / w(slow) == 2.0


def test_radial_directional_averaging_keeps_the_mean_length_along_the_mean_direction():
    """Two unit vectors at right angles, equal weights: the plain mean is 0.707 long, RDA's
    is 1 (their mean length) along the same diagonal; the embeddings take the plain mean."""
    import torch
    from collections import OrderedDict
    from decoupled_diloco import radial_directional

    a = OrderedDict(**{"blocks.0.w": torch.tensor([1.0, 0.0]), "tok_emb.weight": torch.tensor([1.0, 0.0])})
    b = OrderedDict(**{"blocks.0.w": torch.tensor([0.0, 1.0]), "tok_emb.weight": torch.tensor([0.0, 1.0])})
    got = radial_directional([a, b], [1.0, 1.0])
    torch.testing.assert_close(got["blocks.0.w"], torch.tensor([0.7071068, 0.7071068]))
    torch.testing.assert_close(got["tok_emb.weight"], torch.tensor([0.5, 0.5]))


def test_a_retired_worker_no_longer_counts_towards_the_quorum():
    from decoupled_diloco import DecoupledMerge

    s = DecoupledMerge(quorum=3, lr=1.0, momentum=0.0, merge="mean")
    s.start(_p(1.0), num_workers=3)
    assert s.on_update(_u(0, 0.2, tokens=1, steps=1), _p(1.0)) is None
    assert s.on_update(_u(1, 0.4, tokens=1, steps=1), _p(1.0)) is None
    merged = s.on_job_lost(2, job_id=5, reason="retired", params=_p(1.0))
    assert _v(merged) == pytest.approx(1.0 - 0.3) and not s.wants_job(2, version=1)


def test_a_quorum_above_the_worker_count_is_refused_not_capped():
    from decoupled_diloco import DecoupledMerge

    from fedlm.strategies.base import FleetFacts

    with pytest.raises(ValueError, match="outer.quorum: 4 is more than the 3 workers"):
        DecoupledMerge(quorum=4).on_fleet(FleetFacts(0, (1.0, 1.0, 1.0)))
    # and when the config loads, before a run is stored
    with pytest.raises(ConfigError, match="^outer.quorum: 4 is more than the 3 workers$"):
        tiny_config("strategy=decoupled_diloco:DecoupledMerge", "outer.quorum=4")


def test_a_decoupled_run_trains_replays_and_resumes_bit_for_bit(tmp_path):
    trains_replays_and_resumes(tmp_path, "strategy=decoupled_diloco:DecoupledMerge",
                               "grace=adaptive", "outer.quorum=2")
