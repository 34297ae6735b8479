"""Compressed outer gradients: exact sizes, bounded error, error feedback, the engine."""

import sqlite3
from collections import OrderedDict

import pytest
import torch

from fedlm.sim import compression as C, wire_sizes
from fedlm.config import COMPRESSIONS, NetworkConfig
from fedlm.params import BadUpdate, num_bytes
from fedlm.replay import replay
from tests.conftest import tiny_config
from tests.support import run_engine

GRAD = OrderedDict(w=torch.randn(1000, generator=torch.Generator().manual_seed(0)),
                   b=torch.randn(7, 13, generator=torch.Generator().manual_seed(1)))
# Worst relative error of one decode, per codec (int4's 15 levels: about 1/14 of the range).
TOLERANCE = {"fp32": 0.0, "bf16": 8e-3, "fp16": 1e-3, "int8": 8e-3, "int4": 0.15}


@pytest.mark.parametrize("codec", COMPRESSIONS)
def test_payload_bytes_are_the_advertised_size_and_decode_close(codec):
    net = NetworkConfig(compression=codec)
    payload, _ = C.encode(GRAD, {}, net)
    assert sum(t.numel() * t.element_size() for t in payload.values()) == wire_sizes.encoded_bytes(
        GRAD, net)
    out = C.decode(payload, GRAD, net)
    for k, g in GRAD.items():
        assert out[k].dtype == torch.float32 and out[k].shape == g.shape
        assert (out[k] - g).abs().max() <= TOLERANCE[codec] * g.abs().max() + 1e-7


def test_sizes_shrink_as_promised():
    sizes = {c: wire_sizes.encoded_bytes(GRAD, NetworkConfig(compression=c)) for c in COMPRESSIONS}
    n = sum(t.numel() for t in GRAD.values())
    assert sizes["fp32"] == 4 * n and sizes["bf16"] == sizes["fp16"] == 2 * n
    assert n < sizes["int8"] < 1.02 * n  # + one fp32 scale per 256 values
    assert n / 2 < sizes["int4"] < 0.52 * n


def test_error_feedback_carries_the_rounding_error_forward():
    # Sending the same gradient 50 times: with error feedback the sum of what
    # arrived tracks the sum of what was meant; without it the bias accumulates.
    net, plain = NetworkConfig(compression="int4"), NetworkConfig(compression="int4",
                                                                   error_feedback=False)
    sent = {True: torch.zeros(1000), False: torch.zeros(1000)}
    for use_ef, cfg in ((True, net), (False, plain)):
        state = {}
        for _ in range(50):
            payload, state = C.encode(OrderedDict(w=GRAD["w"]), state, cfg)
            sent[use_ef] += C.decode(payload, OrderedDict(w=GRAD["w"]), cfg)["w"]
    meant = 50 * GRAD["w"]
    err_ef = (sent[True] - meant).abs().max()
    err_plain = (sent[False] - meant).abs().max()
    assert err_ef < 0.5 * GRAD["w"].abs().max()  # bounded by one step's error
    assert err_plain > 10 * err_ef


def test_malformed_payloads_are_refused():
    net = NetworkConfig(compression="int8")
    payload, _ = C.encode(GRAD, {}, net)
    for broken in ({k: v for k, v in payload.items() if k != "w/scale"},
                   {**payload, "w/q": payload["w/q"].float()},
                   {**payload, "w/q": payload["w/q"][:-1]},
                   {**payload, "x/q": payload["w/q"]}):
        with pytest.raises(BadUpdate):
            C.decode(broken, GRAD, net)


@pytest.mark.parametrize("codec", ["bf16", "int4"])
def test_compressed_runs_send_fewer_bytes_train_and_replay(tmp_path, codec):
    db = tmp_path / f"{codec}.db"
    cfg = tiny_config("strategy=diloco", f"network.compression={codec}",
                      "network.server_up=2e6", "fleet.jitter=0", "fleet.preset=homogeneous",
                      "reliability.checkpoint_every=0")
    engine, final, run_id = run_engine(cfg, db)
    fp32 = run_engine(tiny_config("strategy=diloco", "network.server_up=2e6", "fleet.jitter=0",
                                  "fleet.preset=homogeneous", "reliability.checkpoint_every=0"),
                      tmp_path / "fp32.db")[0]
    with sqlite3.connect(db) as conn:
        down, up = conn.execute("SELECT SUM(down_bytes), SUM(up_bytes) FROM jobs").fetchone()
        loss = [l for (l,) in conn.execute("SELECT loss FROM metrics ORDER BY id")]
    ratio = {"bf16": 0.5, "int4": 0.5 / 4 + 4 / 256 / 4}[codec]
    assert up == pytest.approx(ratio * down, rel=0.02)  # uploads encoded, downloads fp32
    assert up / engine.jobs.next_job_id == wire_sizes.encoded_bytes(final, cfg.network)
    assert engine.now < fp32.now  # less to push through the shared link
    assert loss[-1] < loss[0]
    assert replay(db, run_id).identical
    assert num_bytes(final) == 4 * sum(t.numel() for t in final.values())
