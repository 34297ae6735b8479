"""Where jobs run on this host: over ``sim.devices`` devices of the run's kind.

    sim.devices = 0   every device torch sees of ``device``'s kind (CUDA: all GPUs; CPU: one)
    sim.devices = N   the first N (CUDA_VISIBLE_DEVICES picks which GPUs are "first")

In process (``fedlm.inprocess``) worker w's jobs run on device w mod N, each device
with ``sim.job_threads`` threads of its own, so the devices work at once; the server
(global model, outer step, evaluation) stays on the first device. A worker always
lands on the same device, so its AdamW state, kept in device memory between its
jobs, never moves. Under Flower, Ray shares the N GPUs among the ClientApp actors
(``gpu_share``; ``fedlm.flower.simulation.backend_config``).

On a CPU, N > 1 names the one CPU N times: N threads, as ``sim.job_threads = N``
would give; the tests place jobs over two "cpu" devices this way.

Where a job ran never changes its bits on one kind of device: what it reads is fixed
by its message, and its outer gradient is moved to the server's device after it.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

from fedlm.config import Config
from fedlm.errors import ConfigError


def visible(kind: str) -> int:
    """Devices of ``kind`` this process sees (a CPU counts as one)."""
    if kind != "cuda":
        return 1
    import torch  # only once a run is starting

    return torch.cuda.device_count()


def devices(cfg: Config) -> list[str]:
    """The devices the run's jobs spread over, the server's first.

    One device keeps the bare name (``"cuda"``: the current device, as before
    ``sim.devices``); several are named by index, since a job thread switches the
    current device and a bare ``"cuda"`` would then mean another GPU."""
    from fedlm.model import resolve_device

    kind = resolve_device(cfg.device)
    have, want = visible(kind), cfg.sim.devices
    if kind == "cpu":
        return ["cpu"] * (want or 1)
    if want > have:
        raise ConfigError(f"sim.devices: must be <= the {have} {kind} devices torch sees, "
                          f"got {want}")
    n = want or have
    return [kind] if n == 1 else [f"{kind}:{i}" for i in range(n)]


def device_of(worker: int, count: int) -> int:
    """The index of the device that runs ``worker``'s jobs: always the same one."""
    return worker % count


def job_pools(places: list[str], threads: int) -> list[ThreadPoolExecutor] | None:
    """A pool of ``threads`` job threads per device; None for one device and one
    thread (jobs then run in the caller's thread, one after another, as before)."""
    if len(places) == 1 and threads == 1:
        return None
    return [ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"fedlm-job-d{i}")
            for i in range(len(places))]


def gpu_count(cfg: Config) -> int:
    """GPUs a Flower run's actors share when its device is CUDA (else none): this
    host's (``devices``), or on a Ray cluster (``sim.ray_address``) ``sim.devices``
    as given, the cluster's GPUs, which this host need not have."""
    from fedlm.model import resolve_device

    if resolve_device(cfg.device) != "cuda":
        return 0
    return cfg.sim.devices if cfg.sim.ray_address and cfg.sim.devices else len(devices(cfg))


def gpu_share(actors: int, gpus: int) -> float:
    """The GPU fraction each of ``actors`` Ray actors asks for, so that all of them fit
    on ``gpus`` GPUs. Ray places a fraction on one GPU, never split over two, so
    6 actors on 4 GPUs take 1/2 each (2 share a GPU), not 4/6 (which fits only one
    actor per GPU: 2 actors would never start). An actor runs one job on one
    device, so it never takes more than one GPU."""
    if not gpus:
        return 0.0
    return 1.0 / math.ceil(actors / gpus)
