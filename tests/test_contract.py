"""Every registered strategy (and the documented plug-in example) through the same checks."""

import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedlm.params import params_hash
from fedlm.strategies import registry
from fedlm.strategies.base import Update
from tests.conftest import tiny_config
from tests.test_engine import run_engine

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
PLUGIN = "fedasync_example:FedAsync"
NAMES = sorted(registry.STRATEGIES) + [PLUGIN]


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def drive(strategy, theta, steps, start_at=0, workers=3):
    """Feed synthetic jobs the way the engine does: dispatch free workers, then
    finish the oldest job; return the sequence of new-model hashes."""
    free, flight, version, out = list(range(workers)), [], 0, []
    for k in range(start_at, start_at + steps):
        for w in list(free):
            if strategy.wants_job(w, version=version):
                strategy.on_dispatch(w, version=version)
                flight.append((w, version))
                free.remove(w)
        w, base = flight.pop(0)
        free.append(w)
        g = torch.Generator().manual_seed(1000 + k)
        grad = OrderedDict((n, 0.01 * torch.randn(t.shape, generator=g)) for n, t in theta.items())
        new = strategy.on_update(Update(worker=w, job_id=k, base_version=base, outer_grad=grad,
                                        tokens=100, local_steps=3, staleness=version - base),
                                 theta)
        if new is not None:
            theta, version = new, version + 1
            out.append(params_hash(theta))
    return theta, out


def params():
    g = torch.Generator().manual_seed(0)
    return OrderedDict(w=torch.randn(4, 4, generator=g), b=torch.randn(4, generator=g))


@pytest.mark.parametrize("name", NAMES)
def test_state_survives_a_save_load_round_trip(name, tmp_path):
    a = registry.build_strategy(name, {})
    theta = params()
    a.start(theta, num_workers=3)
    theta, _ = drive(a, theta, 6)  # two full rounds of 3 workers: a sync round boundary
    torch.save(a.state_dict(), tmp_path / "state.pt")
    b = registry.build_strategy(name, {})
    b.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    # Both continue from the same point with the same inputs: same models.
    _, ha = drive(a, theta, 9, start_at=100)
    _, hb = drive(b, theta, 9, start_at=100)
    assert ha == hb and len(ha) > 0


@pytest.mark.parametrize("name", NAMES)
def test_short_run_is_finite_and_deterministic(name, tmp_path):
    cfg = tiny_config(f"strategy={name}", "fleet.step_times=[1.0, 1.7, 3.1]", "updates=4")
    _, a, _ = run_engine(cfg, tmp_path / "a.db", evaluate=False)
    _, b, _ = run_engine(cfg, tmp_path / "b.db", evaluate=False)
    assert all(torch.isfinite(t).all() for t in a.values())
    assert params_hash(a) == params_hash(b)


def test_plugin_loads_by_dotted_path_and_refuses_unknown_settings():
    from fedlm.config_load import load
    from fedlm.errors import ConfigError

    cfg = load(None, [f"strategy={PLUGIN}", "outer.alpha=0.5"])
    assert registry.build_strategy(cfg.strategy, cfg.outer).alpha == 0.5
    with pytest.raises(ConfigError, match="outer.beta: not a setting"):
        load(None, [f"strategy={PLUGIN}", "outer.beta=1"])
    with pytest.raises(ConfigError, match="cannot import"):
        load(None, ["strategy=no_such_pkg.mod:X"])


def test_docs_show_the_example_verbatim():
    doc = (EXAMPLES.parent / "strategies.md").read_text()
    assert (EXAMPLES / "fedasync_example.py").read_text() in doc
    assert len((EXAMPLES / "fedasync_example.py").read_text().splitlines()) < 60


@pytest.mark.flower
def test_plugin_runs_end_to_end_on_flower(tmp_path):
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLES),
                                                         os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-m", "fedlm", "run", "--quiet", "--db", str(tmp_path / "p.db")]
    for kv in ["model=tiny", "workers=2", "updates=4", "inner.steps=3", "eval.every=2",
               "eval.batches=2", "data.seq_len=64", f"strategy={PLUGIN}"]:
        args += ["--set", kv]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "fedasync_example:FedAsync" in out.stdout
