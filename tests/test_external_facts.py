"""Facts from outside fedlm that its engine and strategies must reproduce.

- The DeepMind toy notebook (google-deepmind/asyncdiloco, AsyncLocalSGDToyExample):
  workers at 0.58 / 0.75 / 1.51 / 3.33 s per step, 20 inner steps, no communication
  cost. Sync: one round every 20 x 3.33 = 66.6 s. Async with its 0.5 s grace
  (``max_wait_time``): 8,000 inner steps (400 jobs of 20) end at t = 1998.6 s.
- The async paper's check of simulating sync with the async framework: with equal
  speeds and no jitter, delayed Nesterov with N = workers and c = 0 computes sync
  DiLoCo (its momentum step is one Nesterov step on the cycle's mean).
- Delayed Nesterov with N = 1 and c = 0 is SGD with Nesterov momentum, as torch has it.
"""

import pytest
import torch

from fedlm import checkpoint, model as M
from fedlm.model import snapshot
from fedlm.engine.dry_run import InstantTransport
from fedlm.runner import run_inprocess
from fedlm.strategies.base import Update
from fedlm.strategies.delayed_nesterov import DelayedNesterov
from tests.conftest import tiny_config
from tests.support import run_engine

# The notebook's fleet: its speeds, H = 20, no jitter, links that cost nothing.
TOY = ["workers=4", "fleet.preset=paper-toy", "inner.steps=20", "fleet.jitter=0.0",
       "fleet.links={free = {latency = 0, down_bw = 1e14, up_bw = 1e14}}",
       "fleet.regions=[\"free\", \"free\", \"free\", \"free\"]"]


def _clock_only(tmp_path, *overrides):
    """The engine on the toy fleet with zero updates: only the virtual clock matters."""
    cfg = tiny_config(*TOY, *overrides)
    theta = snapshot(M.build(cfg.model, cfg.data.seq_len, seed=cfg.seed))
    engine, _, _ = run_engine(cfg, tmp_path / "toy.db", InstantTransport(theta, cfg),
                              evaluate=False)
    return engine


def test_toy_notebook_sync_round_takes_the_slowest_workers_66_6_seconds(tmp_path):
    engine = _clock_only(tmp_path, "strategy=diloco", "updates=20")
    assert engine.now == pytest.approx(20 * 66.6)


def test_toy_notebook_async_run_with_its_half_second_grace_ends_at_1998_6(tmp_path):
    # the notebook applies every arrival (400 jobs of 20 steps) and stops at the 400th
    engine = _clock_only(tmp_path, "strategy=delayed-nesterov", "grace=0.5", "updates=400")
    assert engine.steps_done == 8000
    assert engine.now == pytest.approx(1998.6)


def _final(tmp_path, name, *overrides):
    db = tmp_path / f"{name}.db"
    run_id = run_inprocess(tiny_config(*overrides), str(db))
    return checkpoint.read(checkpoint.weights_for(db, run_id))["params"]


def test_delayed_nesterov_on_equal_workers_is_sync_diloco(tmp_path):
    same = ["workers=4", "profile=homogeneous", "fleet.jitter=0.0", "outer.lr=0.7",
            "outer.momentum=0.9", "seed=5", "data.partition=iid", "inner.steps=4"]
    sync = _final(tmp_path, "sync", *same, "strategy=diloco", "updates=3")
    # N = 4 workers, c = 0, and its defaults (the adaptive grace window): 12 arrivals
    dn = _final(tmp_path, "dn", *same, "strategy=delayed-nesterov", "updates=12")
    for name in sync:
        torch.testing.assert_close(dn[name], sync[name], rtol=1e-5, atol=1e-6)


def test_delayed_nesterov_with_one_arrival_per_cycle_is_torch_nesterov_sgd():
    torch.manual_seed(0)
    theta = {"w": torch.randn(5, 3), "b": torch.randn(3)}
    grads = [{k: torch.randn_like(v) for k, v in theta.items()} for _ in range(6)]
    dn = DelayedNesterov(lr=0.3, momentum=0.9, buffer_size=1, c=0.0)
    dn.start(theta, num_workers=4)
    params = dict(theta)
    for k, g in enumerate(grads):
        params = dn.on_update(Update(worker=0, job_id=k, base_version=k, outer_grad=g,
                                     tokens=1, local_steps=1, staleness=0), params)
    ref = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
    opt = torch.optim.SGD(ref.values(), lr=0.3, momentum=0.9, nesterov=True)
    for g in grads:
        for k, p in ref.items():
            p.grad = g[k].clone()
        opt.step()
    for k in theta:
        torch.testing.assert_close(params[k], ref[k].detach(), rtol=1e-6, atol=1e-6)
