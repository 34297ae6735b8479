"""Every strategy runs on every profile preset (in process, tiny model)."""

import pytest
import torch

from fedlm.sim import fleet
from fedlm.strategies.registry import STRATEGIES
from tests.conftest import tiny_config
from tests.support import run_engine


@pytest.mark.parametrize("preset", fleet.PRESETS)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_strategy_runs_on_preset(tmp_path, strategy, preset):
    # DyLU's job sizes where the strategy takes them; its own policy where it refuses them
    # (diloco-fill: fill)
    policy = [] if "dylu" in getattr(STRATEGIES[strategy], "refused_local_steps", {}) \
        else ["local_steps=dylu"]
    cfg = tiny_config(f"strategy={strategy}", f"profile={preset}", "updates=2",
                      "inner.steps=2", *policy)
    engine, final, _ = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    assert engine.version == 2
    assert all(torch.isfinite(t).all() for t in final.values())
