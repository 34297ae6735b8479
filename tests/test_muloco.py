"""examples/muloco.py: Muon inside (Newton-Schulz on the matrices, AdamW for the rest)
through ``inner.optimizer``, 2 bits a value with error feedback through
``network.compression``; each pinned by hand, and a run that trains, replays and resumes."""

import math
import sqlite3
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedlm import model as M
from fedlm.config import InnerConfig, NetworkConfig
from fedlm.model import snapshot
from fedlm.params import BadUpdate
from tests.support import trains_replays_and_resumes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_a_muon_step_orthogonalises_the_momentum_and_adamw_steps_the_rest():
    from muloco import MuonAdamW

    w = torch.nn.Parameter(torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64))
    b = torch.nn.Parameter(torch.tensor([1.0, 1.0], dtype=torch.float64))
    opt = MuonAdamW([dict(params=[("blocks.w", w)], use_muon=True, momentum=0.95, ns_steps=5),
                     dict(params=[("b", b)], use_muon=False, betas=(0.9, 0.95), eps=1e-8)],
                    lr=0.01, weight_decay=0.1)
    w.grad = torch.tensor([[3.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    b.grad = torch.tensor([0.5, -2.0], dtype=torch.float64)
    opt.step()
    # buffer 0.05·G; Nesterov u = 0.05·G + 0.95·buffer = 0.0975·G, normalised: diag(3, 1)/√10;
    # a diagonal stays diagonal: each singular value s ← a·s + b·s³ + c·s⁵, five times
    u = 0.0975 * math.sqrt(10.0)
    s = [0.0975 * 3 / (u + 1e-7), 0.0975 / (u + 1e-7)]
    for _ in range(5):
        s = [3.4445 * x - 4.7750 * x ** 3 + 2.0315 * x ** 5 for x in s]
    scale = 0.2 * math.sqrt(2.0)  # 0.2·√max(rows, cols)
    assert torch.diagonal(w.detach()).tolist() == pytest.approx(
        [1.0 * (1 - 0.01 * 0.1) - 0.01 * scale * x for x in s], rel=1e-12)
    assert w[0, 1].item() == w[1, 0].item() == 0.0
    assert torch.allclose(opt.state[w]["momentum_buffer"], 0.05 * w.grad, rtol=1e-15)
    # AdamW's first step: the bias-corrected moments give g/|g|
    assert b.detach().tolist() == pytest.approx([0.999 - 0.01, 0.999 + 0.01], rel=1e-7)


def test_the_factory_gives_muon_the_blocks_matrices_and_adamw_the_rest():
    from muloco import muon

    net = M.build("tiny", 64, seed=0)
    opt = muon(net.named_parameters(), InnerConfig(lr=0.02, weight_decay=0.05))
    hidden, rest = (g["param_names"] for g in opt.param_groups)
    assert hidden and all(n.startswith("blocks.") and n.endswith("weight") for n in hidden)
    assert "tok_emb.weight" in rest and "pos_emb.weight" in rest and "ln_f.bias" in rest
    assert all(g["lr"] == 0.02 and g["weight_decay"] == 0.05 for g in opt.param_groups)


def test_two_bits_a_value_with_the_error_carried_to_the_next_job():
    from muloco import TwoBit

    codec, net = TwoBit(), NetworkConfig()
    grad = OrderedDict(w=torch.tensor([0.0, 1.0, 2.0, 3.0, 10.0]))
    payload, errors = codec.encode(grad, {}, net)
    # mean 3.2, std √(62.8/4), bins 6σ/4 = 5.943 wide around code 2: codes 1, 2, 2, 2, 3;
    # each code decodes to the mean of its values: −3.2, −1.2, 6.8 (+ 3.2)
    assert payload["w/q"].tolist() == [1 | 2 << 2 | 2 << 4 | 2 << 6, 3]
    assert payload["w/meta"].tolist() == pytest.approx([3.2, 0.0, -3.2, -1.2, 6.8], rel=1e-6)
    assert codec.decode(payload, grad, net)["w"].tolist() == pytest.approx([0, 2, 2, 2, 10],
                                                                          abs=1e-6)
    assert errors["ef/w"].tolist() == pytest.approx([0, -1, 0, 1, 0], abs=1e-6)
    assert codec.payload_bytes(grad, net) == 2 + 5 * 4
    # next job: nothing new, the error goes out and is sent exactly (codes 2, 1, 2, 3, 2)
    payload, errors = codec.encode(OrderedDict(w=torch.zeros(5)), errors, net)
    assert codec.decode(payload, grad, net)["w"].tolist() == pytest.approx([0, -1, 0, 1, 0],
                                                                          abs=1e-6)
    assert errors["ef/w"].abs().max() < 1e-6
    with pytest.raises(BadUpdate):
        codec.decode({**payload, "w/q": payload["w/q"][:1]}, grad, net)


def test_a_muloco_run_trains_replays_and_resumes_bit_for_bit(tmp_path):
    from muloco import TwoBit

    db = trains_replays_and_resumes(tmp_path, "strategy=diloco", "inner.optimizer=muloco:muon",
                                    "network.compression=muloco:TwoBit")
    with sqlite3.connect(db) as conn:
        up, jobs = conn.execute("SELECT SUM(up_bytes), COUNT(*) FROM jobs").fetchone()
    shapes = snapshot(M.build("tiny", 64, seed=0))
    assert up == jobs * TwoBit().payload_bytes(shapes, NetworkConfig())  # the clock's bytes


def test_pretraining_is_the_starts_not_the_methods_muon_arms_start_where_adamw_arms_do():
    """``init.pretrain_steps`` trains with AdamW whatever ``inner.optimizer`` is, so a
    Muon arm and an AdamW arm of one seed start from the same weights (MuLoCo's arm once
    started from a Muon-pretrained model: a different start, credited to the method)."""
    from fedlm import start
    from fedlm.params import params_hash
    from tests.conftest import tiny_config

    sets = ("init.pretrain_steps=4",)
    adamw = start.starting_point(tiny_config(*sets), "unused.db", use_cache=False)
    muon = start.starting_point(tiny_config(*sets, "inner.optimizer=muloco:muon"),
                                "unused.db", use_cache=False)
    assert params_hash(muon.params) == params_hash(adamw.params)
    fresh = start.initial(tiny_config(*sets))
    assert params_hash(adamw.params) != params_hash(fresh)  # it did pretrain
