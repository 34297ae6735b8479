"""`strategy=diloco-dylu`: synchronous DiLoCo on DyLU's job sizes, one name for
`strategy=diloco local_steps=dylu outer.weighting=tokens` (strategies/diloco_dylu.py)."""

import pytest

from fedlm.config_load import ConfigError, from_json
from fedlm.runner import run_inprocess
from fedlm.store.readers import operation_log
from fedlm.strategies import registry
from tests.conftest import tiny_config

# three workers 1x, 2x and 4x as slow as the fastest, H = 4: DyLU gives them 4, 2 and 1 steps
UNEVEN = ("fleet.step_times=[1.0, 2.0, 4.0]", "inner.steps=4", "updates=3")
LONG = ("strategy=diloco", "local_steps=dylu", "outer.weighting=tokens")


def _run(tmp_path, name, *overrides):
    db = tmp_path / f"{name}.db"
    return operation_log(db, run_inprocess(tiny_config(*overrides), str(db)))


def test_the_name_is_diloco_with_dylu_and_token_weights():
    cfg = tiny_config("strategy=diloco-dylu")
    assert cfg.local_steps == "dylu"  # what the run store, `fedlm config` and replay see
    strategy = registry.build_strategy(cfg.strategy, cfg.outer)
    assert strategy.synchronous and strategy.weighting == "tokens"
    assert (strategy.lr, strategy.momentum, strategy.nesterov) == (0.7, 0.9, True)
    assert from_json(cfg.to_json()) == cfg  # a stored run's config reads back the same
    assert "diloco-dylu" in {name for name, kind, *_ in registry.describe() if kind == "sync"}


def test_a_run_gets_dylus_job_sizes_and_the_long_spellings_weights(tmp_path):
    named = _run(tmp_path, "named", "strategy=diloco-dylu", *UNEVEN)
    steps = {}
    for job in named.jobs.values():
        steps.setdefault(job["worker"], set()).add(job["local_steps"])
    assert steps == {0: {4}, 1: {2}, 2: {1}}
    assert (named.run["strategy"], named.run["local_steps"]) == ("diloco-dylu", "dylu")
    long = _run(tmp_path, "long", *LONG, *UNEVEN)
    assert named.run["final_hash"] == long.run["final_hash"]
    assert named.run["virtual_time"] == long.run["virtual_time"]
    # and the weighting matters here: uniform, the 1-step worker would count 1/3, not 1/7
    uniform = _run(tmp_path, "uniform", *LONG[:2], "outer.weighting=uniform", *UNEVEN)
    assert uniform.run["final_hash"] != named.run["final_hash"]


def test_other_dylu_policies_and_weightings_are_taken_as_given():
    cfg = tiny_config("strategy=diloco-dylu", "local_steps=dylu-floor", "outer.weighting=uniform")
    assert cfg.local_steps == "dylu-floor"
    assert registry.build_strategy(cfg.strategy, cfg.outer).weighting == "uniform"


def test_fixed_local_steps_are_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        tiny_config("strategy=diloco-dylu", "local_steps=fixed")
    message = str(err.value)
    assert message.startswith("local_steps: 'fixed' does not go with strategy 'diloco-dylu'")
    assert "strategy=diloco" in message and "\n" not in message


def test_the_other_strategies_keep_their_local_steps():
    assert tiny_config("strategy=diloco").local_steps == "fixed"
    assert tiny_config("strategy=diloco", "local_steps=fixed").local_steps == "fixed"
    assert tiny_config("strategy=delayed-nesterov").local_steps == "fixed"
    assert tiny_config("strategy=delayed-nesterov", "local_steps=dylu").local_steps == "dylu"
