"""Wire sizes and bandwidth cycles: what the simulator and the planner share.

Both ``fedlm.sim.compression`` / ``fedlm.sim.network`` (the simulator) and ``fedlm.plan``
(the cost model on paper) need to know how many bytes an update takes on the
wire and how the links' bandwidth changes over a virtual day. They are defined
here, once, torch-free:

    encoding    bytes per value              + per block of ``block_size`` values
    fp32        4
    bf16, fp16  2
    int8        1                            4 (one fp32 scale; block_size 0: one
    int4        ½ (two a byte, rounded up)   4  per tensor)

    daily factor(hour h) = 1 − a·(1 + cos(2π(h − peak)/24))/2
                           at the middle of hour h, constant within the hour:
                           1 at the quietest hour, 1 − a at ``peak_hour``.

The encodings are ``fedlm.config.COMPRESSIONS`` (a test checks they agree); a codec
of your own (``fedlm.sim.codecs``) gives its own size, which the simulator times and
the store counts alike (the planner knows the built-in encodings only).
"""

from __future__ import annotations

import math

import numpy as np

from fedlm.config import NetworkConfig
from fedlm.errors import ConfigError
from fedlm.sim import codecs

BYTES_PER_VALUE = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "int4": 0.5}
QUANTISED = ("int8", "int4")  # these also send one scale per block of values
SCALE_BYTES = 4.0  # one fp32 scale
HOUR = 3600.0  # virtual seconds in an hour of the daily cycle


def scale_blocks(values: float, block_size: int) -> int:
    """Scales sent for a tensor of ``values`` values: one per block (0: one in all)."""
    return math.ceil(values / block_size) if block_size > 0 else 1


def tensor_bytes(n: int, compression: str, block_size: int) -> int:
    """Bytes of one tensor of ``n`` values as ``compression.encode`` sends it.

    Every encoding takes whole bytes: int4 packs two values a byte, rounded up
    per tensor; int8 and int4 add ``SCALE_BYTES`` per block.
    """
    nbytes = math.ceil(n * BYTES_PER_VALUE[compression])
    if compression in QUANTISED:
        nbytes += int(SCALE_BYTES) * scale_blocks(n, block_size)
    return nbytes


def encoded_bytes(params, net: NetworkConfig) -> int:
    """Bytes of an encoded update of a model shaped like ``params``."""
    if codecs.is_plugin(net.compression):
        return codecs.payload_bytes(params, net)
    return sum(tensor_bytes(t.numel(), net.compression, net.block_size)
               for t in params.values())


def payload_bytes(params: float, compression: str = "fp32", block_size: int = 256,
                  tensors: int = 1) -> float:
    """Bytes on the wire for ``params`` values sent as ``compression`` (the planner's).

    fp32/bf16/fp16: 4/2/2 bytes a value. int8/int4: 1 or ½ byte a value (int4
    packs two a byte, rounded up per tensor) plus one fp32 scale per block of
    ``block_size`` values, or one per tensor when ``block_size`` is 0. For a
    whole model, spread over ``tensors`` tensors, the rounding is per tensor;
    at the sizes planned here it is negligible. ``params`` need not be whole:
    the sum of ``tensor_bytes`` when it is and the tensors are alike.
    """
    if compression not in BYTES_PER_VALUE:
        raise ConfigError(f"compression: must be one of {', '.join(BYTES_PER_VALUE)}, "
                          f"got {compression!r}")
    per_tensor = params / tensors
    if compression not in QUANTISED:
        return BYTES_PER_VALUE[compression] * params
    values = per_tensor if compression == "int8" else math.ceil(per_tensor / 2)
    return tensors * (values + SCALE_BYTES * scale_blocks(per_tensor, block_size))


def _cycle(hour, amplitude: float, peak_hour: float, cos):
    """The daily formula at ``hour`` (the middle of an hour of the day; a float
    with ``math.cos``, an array with ``np.cos``)."""
    dip = 0.5 * (1.0 + cos(2 * math.pi * (hour - peak_hour) / 24))
    return 1.0 - amplitude * dip


def daily_factor(t: float, amplitude: float, peak_hour: float = 14.0) -> float:
    """Bandwidth multiplier at virtual time ``t`` (the simulator's; constant
    within an hour, 1 when ``amplitude`` is 0)."""
    if amplitude <= 0:
        return 1.0
    hour = (math.floor(t / HOUR) % 24) + 0.5
    return _cycle(hour, amplitude, peak_hour, math.cos)


def daily_factors(amplitude: float, peak_hour: float = 14.0) -> np.ndarray:
    """The 24 hourly multipliers of the day at once (the planner's): hour h's
    is ``daily_factor`` anywhere in [h, h + 1) hours."""
    return _cycle(np.arange(24) + 0.5, amplitude, peak_hour, np.cos)
