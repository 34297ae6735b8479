"""Model parameters as plain tensor dicts, and the one sign convention.

    outer gradient  g = θ_start − θ_end

It points the way a worker moved, with the sign of a gradient, so every outer
optimizer *descends* on it: θ ← θ − step(g). This is the only place the
convention is written down; everything else calls these helpers.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch

Params = "OrderedDict[str, torch.Tensor]"


class BadUpdate(ValueError):
    """An incoming update that must not be applied (the message says why)."""


def snapshot(model: torch.nn.Module) -> "OrderedDict[str, torch.Tensor]":
    """A detached CPU copy of the model's trainable parameters, by name.

    Uses ``named_parameters`` so tied weights appear once.
    """
    return OrderedDict((n, p.detach().to("cpu", copy=True)) for n, p in model.named_parameters())


def load_into(model: torch.nn.Module, params) -> None:
    """Copy ``params`` into the model's parameters in place."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])


def outer_gradient(start, end) -> "OrderedDict[str, torch.Tensor]":
    """g = θ_start − θ_end (see the module docstring)."""
    return OrderedDict((k, start[k] - end[k]) for k in start)


def params_hash(params) -> str:
    """SHA-256 over names, shapes, dtypes and raw bytes: equal hash, equal weights."""
    h = hashlib.sha256()
    for name in sorted(params):
        t = params[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def num_bytes(params) -> int:
    return sum(t.numel() * t.element_size() for t in params.values())


def to_numpy(params) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((k, v.detach().cpu().numpy()) for k, v in params.items())


def from_numpy(arrays) -> "OrderedDict[str, torch.Tensor]":
    return OrderedDict((k, torch.from_numpy(np.array(v, copy=True))) for k, v in arrays.items())


def check_update(update, reference) -> None:
    """Refuse an outer gradient that does not match the model (names, shapes, dtypes)
    or holds NaN/Inf. Raises ``BadUpdate`` naming the first offending tensor."""
    missing = set(reference) - set(update)
    extra = set(update) - set(reference)
    if missing or extra:
        raise BadUpdate(f"update tensors differ from the model: missing {sorted(missing)}, "
                        f"unexpected {sorted(extra)}")
    for name, ref in reference.items():
        t = update[name]
        if tuple(t.shape) != tuple(ref.shape):
            raise BadUpdate(f"{name}: shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
        if t.dtype != ref.dtype:
            raise BadUpdate(f"{name}: dtype {t.dtype}, expected {ref.dtype}")
        if not torch.isfinite(t).all():
            raise BadUpdate(f"{name}: holds NaN or Inf")
