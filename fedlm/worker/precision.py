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

Also where tensors go between host and device: ``to_device`` here and ``to_host``
(in ``fedlm.params``, the floor that hashes and checks updates, which needs it too;
re-exported here), both pinned, asynchronous copies on CUDA, one synchronisation of
the job's own stream for the lot), and ``job_stream``: each thread that runs
jobs on a CUDA device does so on a stream of its own, so jobs of several
simulated workers overlap on one GPU (``sim.job_threads``).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict

import torch

from fedlm.params import to_host


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


_TF32_LOCK = threading.Lock()
_TF32_USERS = 0  # jobs (threads) inside a tf32 scope right now
_TF32_SAVED: tuple = ()


@contextlib.contextmanager
def matmul_scope(precision: str, device: str | torch.device):
    """TF32 matmuls on CUDA for the span of the block with ``tf32``; restored when
    the last job inside such a block leaves it (the switch is process-wide, and
    jobs of several threads may overlap).

    Changes nothing on CPU or with another precision, so the CPU reference loop
    is untouched."""
    global _TF32_USERS, _TF32_SAVED
    if precision != "tf32" or device_type(device) != "cuda":
        yield
        return
    with _TF32_LOCK:
        if _TF32_USERS == 0:
            _TF32_SAVED = (torch.get_float32_matmul_precision(),
                           torch.backends.cuda.matmul.allow_tf32,
                           torch.backends.cudnn.allow_tf32)
            torch.set_float32_matmul_precision("high")
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        _TF32_USERS += 1
    try:
        yield
    finally:
        with _TF32_LOCK:
            _TF32_USERS -= 1
            if _TF32_USERS == 0:
                torch.set_float32_matmul_precision(_TF32_SAVED[0])
                torch.backends.cuda.matmul.allow_tf32 = _TF32_SAVED[1]
                torch.backends.cudnn.allow_tf32 = _TF32_SAVED[2]


def fused_adamw(device: str | torch.device) -> bool:
    """Use ``AdamW(fused=True)``: on CUDA only (on CPU the default is the reference)."""
    return device_type(device) == "cuda"


_COMPILED: dict[tuple, tuple[torch.nn.Module, object]] = {}
_COMPILE_LOCK = threading.Lock()


def compiled(net: torch.nn.Module, key: tuple):
    """``torch.compile(net)``, built once per ``key`` (preset, block size, device,
    precision) and scratch model (one per job thread), and reused while ``net``
    is the same module object (jobs load new weights into it in place, which a
    compiled module sees)."""
    full_key = (*key, id(net))
    with _COMPILE_LOCK:
        entry = _COMPILED.get(full_key)
        if entry is None or entry[0] is not net:
            entry = (net, torch.compile(net))
            _COMPILED[full_key] = entry
    return entry[1]


_THREAD = threading.local()


@contextlib.contextmanager
def job_stream(device: str | torch.device):
    """Run the block on this thread's own CUDA stream (made once per thread), so
    jobs in different threads overlap on the GPU; nothing on other devices."""
    if device_type(device) != "cuda":
        yield
        return
    # one stream per device: a thread may serve jobs on another GPU (sim.devices)
    streams = getattr(_THREAD, "streams", None)
    if streams is None:
        streams = _THREAD.streams = {}
    key = torch.device(device)
    if key not in streams:
        streams[key] = torch.cuda.Stream(device=key)
    # the context also makes the stream's GPU this thread's current device
    with torch.cuda.stream(streams[key]):
        yield


def to_device(tensors, device: str | torch.device) -> "OrderedDict[str, torch.Tensor]":
    """``tensors`` (name -> host tensor) on ``device``: on CUDA through pinned buffers,
    asynchronously on the current stream (later work on that stream sees them);
    elsewhere as ``tensor.to(device)`` (no copy when already there)."""
    if device_type(device) != "cuda":
        return OrderedDict((k, v.to(device)) for k, v in tensors.items())
    target = torch.device(device)
    return OrderedDict((k, _onto(v, target)) for k, v in tensors.items())


def _onto(t: torch.Tensor, target: torch.device) -> torch.Tensor:
    """``t`` on CUDA device ``target``: itself if there already, a peer copy from
    another GPU (torch orders it after both devices' current streams), or a
    pinned asynchronous copy from the host."""
    if t.device.type == "cuda":
        return t if same_device(t.device, target) else t.to(target, non_blocking=True)
    return t.pin_memory().to(target, non_blocking=True)


def same_device(a: str | torch.device, b: str | torch.device) -> bool:
    """Whether ``a`` and ``b`` are one device; a bare ``cuda`` is this thread's current GPU."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    here = torch.cuda.current_device()
    return (a.index if a.index is not None else here) == (b.index if b.index is not None else here)


def to_server(tensors, job_device: str, server_device: str) -> "OrderedDict[str, torch.Tensor]":
    """A job's outer gradient, from the job's device to the server's: the host
    (``to_host``), or another GPU (``sim.devices``). A peer copy runs on the source
    GPU's current stream (the job's), so one synchronisation of that stream has
    the copies finished before the engine's thread, on other streams, reads them."""
    if device_type(server_device) == "cpu":
        return to_host(tensors)
    out = to_device(tensors, server_device)
    torch.cuda.current_stream(torch.device(job_device)).synchronize()
    return out
