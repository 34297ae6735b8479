"""The inner loop's arithmetic on the device: precision, fused AdamW, torch.compile.

    inner.precision  auto | fp32 | tf32 | bf16      (docs/gpu.md)
    inner.compile    false | true

``resolve`` turns ``auto`` into what this device does best: ``bf16`` on a CUDA
device that supports it, ``fp32`` everywhere else (CPU, where the determinism
tests run, so the default there is today's bit-exact loop). ``bf16`` is
``torch.autocast`` around forward + loss only: the weights, their gradients and
the AdamW moments stay fp32. ``tf32`` lets CUDA matmuls use TF32 for the span of
a job (restored after it); on CPU it is fp32. Fused AdamW is used where it is a
CUDA kernel (on CPU torch's default implementation is kept: its bits are the
reference). A compiled model is built once per process and reused by every job
of that process (``compiled``).

Also the one place that copies tensors to the host: ``to_host`` (pinned,
asynchronous copies on CUDA, one synchronisation for the lot).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import torch


def resolve(choice: str, device: str) -> str:
    """The precision ``choice`` means on ``device`` (``auto`` resolved)."""
    if choice != "auto":
        return choice
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def device_type(device: str | torch.device) -> str:
    return torch.device(device).type


def autocast(precision: str, device: str | torch.device):
    """The context forward + loss run in: bf16 autocast, or nothing at all (fp32, tf32)."""
    if precision == "bf16":
        return torch.autocast(device_type=device_type(device), dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def matmul_scope(precision: str, device: str | torch.device):
    """TF32 matmuls on CUDA for the span of the block with ``tf32``; restored after.

    Changes nothing on CPU or with another precision, so the CPU reference loop
    is untouched."""
    if precision != "tf32" or device_type(device) != "cuda":
        yield
        return
    saved = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.backends.cudnn.allow_tf32 = saved[2]


def fused_adamw(device: str | torch.device) -> bool:
    """Use ``AdamW(fused=True)``: on CUDA only (on CPU the default is the reference)."""
    return device_type(device) == "cuda"


_COMPILED: dict[tuple, tuple[torch.nn.Module, object]] = {}


def compiled(net: torch.nn.Module, key: tuple):
    """``torch.compile(net)``, built once per ``key`` (preset, block size, device,
    precision) and process, and reused while ``net`` is the same module object
    (jobs load new weights into it in place, which a compiled module sees)."""
    entry = _COMPILED.get(key)
    if entry is None or entry[0] is not net:
        entry = (net, torch.compile(net))
        _COMPILED[key] = entry
    return entry[1]


def to_host(tensors) -> "OrderedDict[str, torch.Tensor]":
    """Detached CPU copies of ``tensors`` (a name -> tensor mapping).

    CPU tensors are copied as ``tensor.to('cpu', copy=True)`` always did. Device
    tensors go to pinned host buffers asynchronously, then one synchronisation
    waits for all of them (instead of one blocking copy per tensor)."""
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    pending = False
    for name, t in tensors.items():
        t = t.detach()
        if t.device.type == "cuda":
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            buf.copy_(t, non_blocking=True)
            out[name] = buf
            pending = True
        else:
            out[name] = t.to("cpu", copy=True)
    if pending:
        torch.cuda.synchronize()
    return out
