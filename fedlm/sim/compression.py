"""What an outer gradient travels as: fp32, bf16, fp16, int8 or 4-bit.

The worker encodes its outer gradient into a *payload* (a dict of tensors: what
the ClientApp really puts in its Flower message), the server decodes it back to
fp32 before anything else looks at it. So the bytes on the wire, the bytes in
the run store and the transfer times on the virtual clock are the encoded
sizes.

    fp32        the tensors as they are                       4 bytes / value
    bf16, fp16  cast (bf16 travels as its raw int16 bits)     2 bytes / value
    int8        symmetric, one fp32 scale per block of         1 byte / value
                ``block_size`` values (0: one per tensor)       + 4 bytes / block
    int4        the same with 15 levels, two values a byte    0.5 byte / value
                                                                + 4 bytes / block

(The sizes are ``fedlm.sim.wire_sizes``'s, shared with the planner.)

Error feedback (int8, int4; ``network.error_feedback``): the worker adds the
rounding error it made last time to this gradient before quantising and keeps
the new error (Seide et al. 2014; Karimireddy et al. 2019), so nothing is lost
for good, only late. The error lives with the worker's optimizer state
(``ef/<name>`` tensors), addressed by job like the rest of it.

A payload that does not decode — a missing or extra tensor, a wrong dtype or
size — is a ``BadUpdate``, refused at the boundary like a NaN.

``network.compression = "package.module:Codec"`` is a codec of your own
(``fedlm.sim.codecs``): ``encode`` and ``decode`` hand it the same arguments.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

from fedlm.sim import codecs, wire_sizes as wire
from fedlm.config import NetworkConfig
from fedlm.params import BadUpdate

EF_PREFIX = codecs.EF_PREFIX
_LEVELS = {"int8": 127, "int4": 7}


def _quantise(x: torch.Tensor, levels: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    flat = x.reshape(-1)
    size = flat.numel() if block <= 0 else block
    pad = (-flat.numel()) % size
    rows = torch.nn.functional.pad(flat, (0, pad)).view(-1, size)
    scale = rows.abs().amax(dim=1) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(rows / safe[:, None]), -levels, levels)
    return q.reshape(-1)[:flat.numel()].to(torch.int8), scale.float()


def _dequantise(q: torch.Tensor, scale: torch.Tensor, shape, block: int) -> torch.Tensor:
    n = math.prod(shape)
    size = n if block <= 0 else block
    pad = (-n) % size
    rows = torch.nn.functional.pad(q.float(), (0, pad)).view(-1, size)
    return (rows * scale[:, None]).reshape(-1)[:n].reshape(shape)


def _pack4(q: torch.Tensor) -> torch.Tensor:
    u = (q.to(torch.int16) + 8).to(torch.uint8)  # -7..7 -> 1..15
    if u.numel() % 2:
        u = torch.cat([u, torch.zeros(1, dtype=torch.uint8)])
    return u[0::2] | (u[1::2] << 4)


def _unpack4(packed: torch.Tensor, n: int) -> torch.Tensor:
    lo, hi = packed & 0x0F, packed >> 4
    u = torch.stack([lo, hi], dim=1).reshape(-1)[:n]
    return u.to(torch.int16).sub(8).to(torch.int8)


def encode(grad, state: dict, net: NetworkConfig) -> tuple["OrderedDict[str, torch.Tensor]", dict]:
    """The payload for ``grad`` and the worker's error-feedback tensors after it.

    ``state`` holds the previous errors (``ef/<name>``); returns the new ones."""
    codec = net.compression
    if codecs.is_plugin(codec):
        return codecs.encode(grad, state, net)
    payload: OrderedDict[str, torch.Tensor] = OrderedDict()
    errors: dict[str, torch.Tensor] = {}
    for name, g in grad.items():
        if codec == "fp32":
            payload[name] = g
        elif codec == "bf16":  # sent as its raw 16 bits: numpy (and so Flower) has no bf16
            payload[name] = g.to(torch.bfloat16).view(torch.int16)
        elif codec == "fp16":
            payload[name] = g.to(torch.float16)
        else:
            x = g + state[EF_PREFIX + name] if EF_PREFIX + name in state else g
            q, scale = _quantise(x, _LEVELS[codec], net.block_size)
            if net.error_feedback:
                errors[EF_PREFIX + name] = x - _dequantise(q, scale, x.shape, net.block_size)
            payload[f"{name}/q"] = _pack4(q) if codec == "int4" else q
            payload[f"{name}/scale"] = scale
    return payload, errors


def decode(payload, reference, net: NetworkConfig) -> "OrderedDict[str, torch.Tensor]":
    """fp32 tensors shaped like ``reference`` from a payload; ``BadUpdate`` if it cannot be."""
    codec = net.compression
    if codecs.is_plugin(codec):
        return codecs.decode(payload, reference, net)
    if codec in ("fp32",):
        return OrderedDict(payload)  # checked as it is by params.check_update
    want = {"bf16": torch.int16, "fp16": torch.float16}.get(codec)
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    if want is not None:
        _same_keys(payload, list(reference))
        for name, ref in reference.items():
            t = payload[name]
            if t.dtype != want or tuple(t.shape) != tuple(ref.shape):
                raise BadUpdate(f"{name}: {t.dtype} {tuple(t.shape)}, expected {want} "
                                f"{tuple(ref.shape)} ({codec} payload)")
            out[name] = (t.view(torch.bfloat16) if codec == "bf16" else t).float()
        return out
    _same_keys(payload, [f"{n}/{part}" for n in reference for part in ("q", "scale")])
    for name, ref in reference.items():
        q, scale = payload[f"{name}/q"], payload[f"{name}/scale"]
        n = ref.numel()
        qn = math.ceil(n / 2) if codec == "int4" else n
        want_q = torch.uint8 if codec == "int4" else torch.int8
        if q.dtype != want_q or q.numel() != qn or q.dim() != 1:
            raise BadUpdate(f"{name}/q: {q.dtype} {tuple(q.shape)}, expected {want_q} ({qn},)")
        blocks = wire.scale_blocks(n, net.block_size)
        if scale.dtype != torch.float32 or scale.numel() != blocks:
            raise BadUpdate(f"{name}/scale: {scale.dtype} {tuple(scale.shape)}, expected "
                            f"float32 ({blocks},)")
        values = _unpack4(q, n) if codec == "int4" else q
        out[name] = _dequantise(values, scale, tuple(ref.shape), net.block_size)
    return out


def _same_keys(payload, expected: list[str]) -> None:
    missing, extra = set(expected) - set(payload), set(payload) - set(expected)
    if missing or extra:
        raise BadUpdate(f"payload tensors differ from the model: missing {sorted(missing)}, "
                        f"unexpected {sorted(extra)}")
