"""Wire sizes and the daily bandwidth cycle (fedlm.sim.wire_sizes): one definition, and the
simulator (fedlm.sim.compression, fedlm.sim.network) and the planner (fedlm.plan) agree on it."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from fedlm.sim import compression, wire_sizes as wire
from fedlm.config import COMPRESSIONS, NetworkConfig
from fedlm.errors import ConfigError
from fedlm.sim.network import Network


def test_the_encodings_are_the_configs():
    assert tuple(wire.BYTES_PER_VALUE) == COMPRESSIONS
    assert set(wire.QUANTISED) <= set(COMPRESSIONS)


@pytest.mark.parametrize("codec", COMPRESSIONS)
@pytest.mark.parametrize("block", [256, 100, 0])
@pytest.mark.parametrize("n", [1, 255, 257, 10_001])
def test_payload_bytes_are_the_encoded_bytes(codec, block, n):
    params = OrderedDict(w=torch.zeros(n))
    net = NetworkConfig(compression=codec, block_size=block)
    want = wire.encoded_bytes(params, net)
    assert wire.payload_bytes(n, codec, block) == want
    # a model of three alike tensors: rounding and scales per tensor
    three = OrderedDict((name, torch.zeros(n)) for name in "abc")
    assert wire.payload_bytes(3 * n, codec, block, tensors=3) == \
        wire.encoded_bytes(three, net)
    payload, _ = compression.encode(three, {}, net)
    assert sum(t.numel() * t.element_size() for t in payload.values()) == \
        wire.encoded_bytes(three, net)


def test_payload_bytes_refuses_an_unknown_encoding():
    with pytest.raises(ConfigError, match="compression: must be one of"):
        wire.payload_bytes(1e9, "int2")


@pytest.mark.parametrize("amplitude, peak", [(0.5, 14.0), (0.3, 2.5), (0.9, 23.0)])
def test_the_planners_hours_are_the_simulators_cycle(amplitude, peak):
    """Hour h of ``daily_factors`` is the simulator's factor anywhere in that hour, any day."""
    net = Network(0, 0, amplitude, peak)
    hourly = wire.daily_factors(amplitude, peak)
    assert len(hourly) == 24
    for day in (0, 1, 5):
        for h in range(24):
            start = (24 * day + h) * wire.HOUR
            for t in (start, start + 1800.0, start + wire.HOUR - 1e-3):
                assert net.factor(t) == wire.daily_factor(t, amplitude, peak)
                assert net.factor(t) == pytest.approx(float(hourly[h]), rel=1e-14)
    assert min(hourly) == pytest.approx(1 - amplitude, abs=amplitude * 0.01)
    assert max(hourly) <= 1.0


def test_no_cycle_is_a_factor_of_one():
    assert Network(0, 0).factor(12345.0) == wire.daily_factor(12345.0, 0.0) == 1.0
