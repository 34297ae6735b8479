"""The grace period, the fourth piece of the delayed-Nesterov paper's framework.

With c = 0, N pushes of delayed Nesterov add up to one Nesterov step on their mean.
So on equally fast workers, a grace period wide enough to catch a whole cycle of
arrivals makes every worker restart from the post-momentum model, and DN computes
what synchronous DiLoCo computes (up to float rounding). Without it the first
finishers restart before the cycle's momentum step and the runs part ways.
"""

import torch

from fedlm import checkpoint
from fedlm.runner import run_inprocess
from tests.conftest import tiny_config

# Homogeneous workers whose jobs finish within ±10% of each other (5 s jobs).
SAME_SPEED = ["workers=4", "profile=homogeneous", "fleet.jitter=0.05", "inner.steps=5",
              "outer.lr=0.7", "outer.momentum=0.9", "seed=3", "data.partition=iid"]


def _final(tmp_path, name, *overrides):
    db = tmp_path / f"{name}.db"
    run_id = run_inprocess(tiny_config(*SAME_SPEED, *overrides), str(db))
    return checkpoint.read(checkpoint.weights_for(db, run_id))["params"]


def _largest_difference(a, b) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_delayed_nesterov_with_a_wide_grace_period_is_sync_diloco(tmp_path):
    sync = _final(tmp_path, "sync", "strategy=diloco", "updates=4")
    # 4 sync rounds = 16 async pushes = 4 delayed momentum steps
    dn = _final(tmp_path, "dn", "strategy=delayed-nesterov", "updates=16", "grace=2")
    for name in sync:
        torch.testing.assert_close(dn[name], sync[name], rtol=1e-4, atol=1e-5)
    no_grace = _final(tmp_path, "nograce", "strategy=delayed-nesterov", "updates=16")
    assert _largest_difference(no_grace, sync) > 100 * _largest_difference(dn, sync)


def test_grace_does_not_change_a_synchronous_run(tmp_path):
    a = _final(tmp_path, "a", "strategy=diloco", "updates=3")
    b = _final(tmp_path, "b", "strategy=diloco", "updates=3", "grace=2")
    assert all(torch.equal(a[k], b[k]) for k in a)
