"""``inner.optimizer``: AdamW as ever, or a factory loaded by dotted path whose state
round-trips per parameter through the worker's state (fedlm/worker/optimizers.py)."""

import pytest
import torch

from fedlm import config_load, model as M, store
from fedlm.errors import ConfigError
from fedlm.job import JobSpec
from fedlm.model import snapshot
from fedlm.replay import replay
from fedlm.runner import run_inprocess
from fedlm.worker.train import new_optimizer, run_job
from tests.conftest import tiny_config

SGD = "tests.test_inner_optimizer:sgd_two_groups"


def sgd_two_groups(parameters, inner):
    """SGD with momentum, matrices in a group after the rest: torch then numbers the
    parameters out of the model's order, which the state must survive."""
    parameters = list(parameters)
    rest = [(n, p) for n, p in parameters if p.dim() != 2]
    matrices = [(n, p) for n, p in parameters if p.dim() == 2]
    return torch.optim.SGD([{"params": rest}, {"params": matrices}], lr=inner.lr,
                           momentum=0.9)


def not_an_optimizer(parameters, inner):
    return "adam, please"


def test_adamw_is_the_default_and_a_factory_gets_named_parameters_and_inner():
    cfg = tiny_config()
    net = M.build(cfg.model, cfg.data.seq_len, seed=0)
    assert cfg.inner.optimizer == "adamw" and type(new_optimizer(net, cfg)) is torch.optim.AdamW
    opt = new_optimizer(net, tiny_config(f"inner.optimizer={SGD}", "inner.lr=0.01"))
    assert type(opt) is torch.optim.SGD and opt.param_groups[0]["lr"] == 0.01
    assert [g["param_names"][0] for g in opt.param_groups] == ["blocks.0.ln1.weight",
                                                               "tok_emb.weight"]


@pytest.mark.parametrize("value, message", [
    ("sgd", "inner.optimizer: must be adamw or package.module:name, got 'sgd'"),
    ("no_such_module:f", "inner.optimizer: cannot import 'no_such_module'"),
    ("tests.test_inner_optimizer:nothing", "inner.optimizer: 'tests.test_inner_optimizer' "
                                           "has no 'nothing'"),
    ("tests.test_inner_optimizer:SGD", "inner.optimizer: 'tests.test_inner_optimizer:SGD' is "
                                       "not callable"),
])
def test_a_bad_inner_optimizer_is_one_line(value, message):
    with pytest.raises(ConfigError) as err:
        config_load.load(None, [f"inner.optimizer={value}"])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_factory_that_makes_no_optimizer_is_one_line():
    cfg = tiny_config("inner.optimizer=tests.test_inner_optimizer:not_an_optimizer")
    net = M.build(cfg.model, cfg.data.seq_len, seed=0)
    with pytest.raises(TypeError, match="returned str, not a torch.optim.Optimizer"):
        new_optimizer(net, cfg)


def raises(parameters, inner):
    raise RuntimeError("no optimizer today")


@pytest.mark.parametrize("name, message", [
    ("not_an_optimizer", "inner.optimizer: 'tests.test_inner_optimizer:not_an_optimizer' "
                         "returned str, not a torch.optim.Optimizer"),
    ("raises", "inner.optimizer: tests.test_inner_optimizer:raises failed on the 'tiny' "
               "model: RuntimeError: no optimizer today"),
])
def test_fedlm_run_refuses_a_failing_factory_before_the_run_is_stored(tmp_path, name, message):
    """Found when jobs ran, such a factory made a run whose every worker failed its jobs."""
    import subprocess
    import sys

    db = tmp_path / "o.db"
    out = subprocess.run([sys.executable, "-m", "fedlm", "run", "--backend", "inprocess",
                          "--db", str(db), "--set", "model=tiny", "--set",
                          f"inner.optimizer=tests.test_inner_optimizer:{name}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == f"fedlm: error: {message}"
    assert not db.exists()


def test_a_factorys_state_is_kept_by_parameter_name_and_carried_to_the_next_job():
    cfg = tiny_config(f"inner.optimizer={SGD}", "inner.warmup_steps=0")
    theta = snapshot(M.build(cfg.model, cfg.data.seq_len, seed=0))
    first = run_job(theta, {}, JobSpec(0, 0, 0, 2, 7), cfg)
    buffers = {k: v for k, v in first.opt_state.items() if k.endswith("/momentum_buffer")}
    assert {k.rsplit("/", 1)[0] for k in buffers} == set(theta)  # every parameter, by name
    for key, buf in buffers.items():  # each under its own name, though numbered out of order
        assert buf.shape == theta[key.rsplit("/", 1)[0]].shape, key
    # the next job starts from that state (a copy, as the worker's state store hands it
    # out: the optimizer trains it in place): a worker's momentum goes on across jobs
    def copy():
        return {k: v.clone() if torch.is_tensor(v) else v for k, v in first.opt_state.items()}
    carried = run_job(theta, copy(), JobSpec(1, 0, 0, 2, 8), cfg)
    fresh = run_job(theta, {"schedule_step": 2}, JobSpec(1, 0, 0, 2, 8), cfg)
    assert any(not torch.equal(carried.result.outer_grad[n], fresh.result.outer_grad[n])
               for n in theta)
    again = run_job(theta, copy(), JobSpec(1, 0, 0, 2, 8), cfg)
    assert all(torch.equal(carried.opt_state[k], again.opt_state[k])
               for k in carried.opt_state if k != "schedule_step")


def test_a_run_with_a_factory_trains_and_replays_bit_for_bit(tmp_path):
    db = tmp_path / "sgd.db"
    run_inprocess(tiny_config(f"inner.optimizer={SGD}", "inner.lr=0.3", "workers=2",
                              "updates=3"), str(db))
    s = store.summarize(db, 1)
    assert s.final_perplexity < s.first_perplexity
    assert replay(db, 1).identical
