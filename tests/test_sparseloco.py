"""examples/sparseloco.py: SparseLoCo's codec (top-k per chunk of a decaying error
accumulator, 2 bits a kept value) pinned by hand on eight values, and a run that trains,
replays and resumes with the codec's bytes on the clock."""

import sqlite3
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedlm import model as M
from fedlm.config import NetworkConfig
from fedlm.model import snapshot
from fedlm.params import BadUpdate
from tests.support import trains_replays_and_resumes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _toy():
    from sparseloco import SparseLoCo

    class Toy(SparseLoCo):  # settings are class attributes: chunks of 4, 2 kept, β = 0.5
        CHUNK, TOP_K, DECAY = 4, 2, 0.5

    return Toy()


def test_the_top_k_of_each_chunk_go_out_in_two_bits_and_the_rest_decays_in_the_error():
    codec, net = _toy(), NetworkConfig()
    grad = OrderedDict(w=torch.tensor([0.1, -0.5, 0.2, 0.05, 0.3, 0.0, -0.1, 0.4]))
    payload, errors = codec.encode(grad, {}, net)
    # chunk [0.1, −0.5, 0.2, 0.05] keeps indices 1, 2; chunk [0.3, 0, −0.1, 0.4] keeps 0, 3
    assert payload["w/idx"].tolist() == [1, 2, 0, 3]
    # kept −0.5, 0.2, 0.3, 0.4: mean 0.1, σ = √(0.5/3), bins 6σ/4 = 0.612 wide: codes 1, 2, 2, 2;
    # code 1 decodes to −0.6 + 0.1, code 2 to mean(0.1, 0.2, 0.3) + 0.1
    assert payload["w/q"].tolist() == [1 | 2 << 2 | 2 << 4 | 2 << 6]
    sent = [0, -0.5, 0.3, 0, 0.3, 0, 0, 0.3]
    assert codec.decode(payload, grad, net)["w"].tolist() == pytest.approx(sent, abs=1e-6)
    error = [g - s for g, s in zip(grad["w"].tolist(), sent)]
    assert errors["ef/w"].tolist() == pytest.approx(error, abs=1e-6)
    assert codec.payload_bytes(grad, net) == 4 + 1 + 5 * 4  # indices, codes, shift + levels
    # next job, nothing new: e = β·error = [.05, 0, −.05, .025 | 0, 0, −.05, .05]
    payload, errors = codec.encode(OrderedDict(w=torch.zeros(8)), errors, net)
    assert payload["w/idx"].tolist() == [0, 2, 2, 3]
    sent = [0.05, 0, -0.05, 0, 0, 0, -0.05, 0.05]  # ±0.05 around mean 0: codes 3, 1, 1, 3
    assert codec.decode(payload, grad, net)["w"].tolist() == pytest.approx(sent, abs=1e-6)
    assert errors["ef/w"].tolist() == pytest.approx([0, 0, 0, 0.025, 0, 0, 0, 0], abs=1e-6)


def test_a_payload_that_is_not_the_codecs_is_refused():
    codec, net = _toy(), NetworkConfig()
    grad = OrderedDict(w=torch.arange(8.0))
    payload, _ = codec.encode(grad, {}, net)
    for broken in ({**payload, "w/idx": torch.tensor([1, 2, 0, 7], dtype=torch.uint8)},
                   {**payload, "w/idx": payload["w/idx"].long()},
                   {k: v for k, v in payload.items() if k != "w/meta"}):
        with pytest.raises(BadUpdate):
            codec.decode(broken, grad, net)


def test_a_sparseloco_run_trains_replays_and_resumes_bit_for_bit(tmp_path):
    from sparseloco import SparseLoCo

    db = trains_replays_and_resumes(tmp_path, "strategy=fedavg",
                                    "network.compression=sparseloco:SparseLoCo")
    with sqlite3.connect(db) as conn:
        up, down, jobs = conn.execute("SELECT SUM(up_bytes), SUM(down_bytes), COUNT(*) "
                                      "FROM jobs").fetchone()
    shapes = snapshot(M.build("tiny", 64, seed=0))
    assert up == jobs * SparseLoCo().payload_bytes(shapes, NetworkConfig())
    assert up < down / 30  # about 2% of the values, each in one byte and a quarter
