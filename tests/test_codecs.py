"""``network.compression = "package.module:Codec"``: a codec of your own encodes on the
worker, decodes on the server, and its payload's bytes are what the virtual clock times
and the store counts; its error feedback lives with the worker's state (fedlm/sim/codecs.py)."""

import sqlite3
from collections import OrderedDict

import pytest
import torch

from fedlm import config_load
from fedlm.config import NetworkConfig
from fedlm.errors import ConfigError
from fedlm.params import BadUpdate
from fedlm.replay import replay
from fedlm.sim import compression as C, wire_sizes
from tests.conftest import tiny_config
from tests.support import run_engine

SIGN = "tests.test_codecs:SignCodec"


class SignCodec:
    """Scaled sign with error feedback (Karimireddy et al. 2019): one int8 sign a value
    and one fp32 scale, mean |x|, a tensor."""

    def encode(self, grad, state, net):
        payload, errors = OrderedDict(), {}
        for name, g in grad.items():
            x = g + state.get("ef/" + name, 0.0)
            scale = x.abs().mean().reshape(1)
            sign = torch.where(x >= 0, 1, -1).to(torch.int8).reshape(-1)
            payload[name + "/sign"], payload[name + "/scale"] = sign, scale
            errors["ef/" + name] = x - sign.float().reshape(x.shape) * scale
        return payload, errors

    def decode(self, payload, reference, net):
        if set(payload) != {f"{n}/{p}" for n in reference for p in ("sign", "scale")}:
            raise BadUpdate("sign payload: wrong tensors")
        return OrderedDict((n, payload[n + "/sign"].float().reshape(r.shape)
                            * payload[n + "/scale"]) for n, r in reference.items())

    def payload_bytes(self, reference, net):
        return sum(t.numel() + 4 for t in reference.values())


class StrayErrors(SignCodec):
    def encode(self, grad, state, net):
        payload, errors = super().encode(grad, state, net)
        return payload, {k[3:]: v for k, v in errors.items()}


NET = NetworkConfig(compression=SIGN)
GRAD = OrderedDict(w=torch.tensor([0.5, -0.25, 0.125, 0.0]), b=torch.tensor([-2.0]))


def test_the_codec_encodes_decodes_and_sizes_the_wire():
    payload, errors = C.encode(GRAD, {}, NET)
    assert payload["w/sign"].tolist() == [1, -1, 1, 1] and payload["w/scale"].item() == 0.21875
    decoded = C.decode(payload, GRAD, NET)
    assert decoded["w"].tolist() == [0.21875, -0.21875, 0.21875, 0.21875]
    assert torch.equal(errors["ef/w"], GRAD["w"] - decoded["w"])
    # the next job's gradient carries the error forward
    again, _ = C.encode(OrderedDict(w=torch.zeros(4), b=torch.zeros(1)), errors, NET)
    assert again["w/sign"].tolist() == [1, -1, -1, -1]
    assert wire_sizes.encoded_bytes(GRAD, NET) == (4 + 4) + (1 + 4)
    with pytest.raises(BadUpdate):
        C.decode({"w/sign": payload["w/sign"]}, GRAD, NET)


def test_error_feedback_must_be_named_as_the_workers_state_keeps_it():
    with pytest.raises(ValueError, match=r"errors named \['w', 'b'\]: error-feedback tensors "
                                         r"must be named ef/"):
        C.encode(GRAD, {}, NetworkConfig(compression="tests.test_codecs:StrayErrors"))


@pytest.mark.parametrize("value, message", [
    ("int3", "network.compression: must be fp32, bf16, fp16, int8, int4 or "
             "package.module:Codec, got 'int3'"),
    ("no_such_module:C", "network.compression: cannot import 'no_such_module'"),
    ("tests.test_codecs:GRAD", "network.compression: 'tests.test_codecs:GRAD' is not a "
                               "codec class"),
])
def test_a_bad_codec_is_one_line(value, message):
    with pytest.raises(ConfigError) as err:
        config_load.load(None, [f"network.compression={value}"])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_run_sends_the_codecs_bytes_trains_and_replays(tmp_path):
    common = ["strategy=diloco", "network.server_up=2e6", "fleet.jitter=0",
              "fleet.preset=homogeneous", "reliability.checkpoint_every=0"]
    db = tmp_path / "sign.db"
    engine, final, run_id = run_engine(tiny_config(*common, f"network.compression={SIGN}"), db)
    fp32 = run_engine(tiny_config(*common), tmp_path / "fp32.db")[0]
    with sqlite3.connect(db) as conn:
        up, jobs = conn.execute("SELECT SUM(up_bytes), COUNT(*) FROM jobs").fetchone()
        loss = [v for (v,) in conn.execute("SELECT loss FROM metrics ORDER BY id")]
    assert up == jobs * sum(t.numel() + 4 for t in final.values())
    assert engine.now < fp32.now  # a quarter of the bytes through the shared link
    assert loss[-1] < loss[0]
    assert replay(db, run_id).identical


class SaysBytes(SignCodec):
    said = 0

    def payload_bytes(self, reference, net):
        return type(self).said


@pytest.mark.parametrize("said", [-5, 0, float("nan"), float("inf"), 1e300, "many", None, True])
def test_a_codecs_byte_count_is_checked_as_a_typed_quantity(monkeypatch, said):
    """A negative, NaN, petabyte-large or non-numeric size would time transfers as
    nonsense (or, at 1e300 bytes, for ever): refused in one line naming the codec."""
    from fedlm.sim import codecs

    monkeypatch.setattr(SaysBytes, "said", said)
    net = NetworkConfig(compression="tests.test_codecs:SaysBytes")
    with pytest.raises(ConfigError, match="tests.test_codecs:SaysBytes's payload_bytes gave "
                                          ".*; it must be bytes on the wire in"):
        codecs.payload_bytes(GRAD, net)
    monkeypatch.setattr(SaysBytes, "said", 12.0)
    assert codecs.payload_bytes(GRAD, net) == 12


class SizesFail(SignCodec):
    def payload_bytes(self, reference, net):
        raise RuntimeError("no sizes here")


@pytest.mark.parametrize("codec, message", [
    ("SaysBytes", "network.compression: tests.test_codecs:SaysBytes's payload_bytes gave -5; "
                  "it must be bytes on the wire in"),
    ("SizesFail", "network.compression: tests.test_codecs:SizesFail's payload_bytes failed on "
                  "the 'tiny' model: RuntimeError: no sizes here"),
])
def test_a_codecs_sizes_are_asked_before_the_run_is_stored(tmp_path, monkeypatch, codec,
                                                           message):
    """Its byte counts were refused only once the run had started (a run stored, failed);
    fedlm run and fedlm deploy ask the codec for the model's bytes before."""
    from tests._cli import assert_refused, run_cli

    monkeypatch.setattr(SaysBytes, "said", -5)
    monkeypatch.chdir(tmp_path)
    for argv in (["run", "--backend", "inprocess"], ["deploy", "local"]):
        db = tmp_path / f"{argv[0]}.db"
        rc, out, err = run_cli([*argv, "--set", "model=tiny", "--set",
                                f"network.compression=tests.test_codecs:{codec}",
                                "--db", str(db)])
        assert_refused(rc, out, err, message)
        assert not db.exists()
