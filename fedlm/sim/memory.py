"""How much memory a run needs, estimated before it starts; a run that cannot fit on
this machine is refused in one line (``fedlm run`` asks before any library loads).

Besides the processes themselves (Python and torch; with Flower also Ray's own
processes and its ClientApp actors), a run holds:

- on the server, a few copies of the model: the global weights, the strategy's
  state, the versions that jobs in flight started from;
- per job in flight (every worker at once, unless ``max_in_flight`` caps it): its
  reply, an outer gradient the size of the model; with Flower also the message
  that carries the model to the worker (Flower's in-memory link state keeps both);
- per worker, its AdamW state (two tensors the size of the model) when
  ``inner.state_store`` keeps it in memory (``context``); ``disk`` keeps it in
  files on the node instead (in process, written behind the jobs: the states not
  written yet, and written ones while there is room, at most ``STATES_KEPT``
  or one state, stay in memory).

Each is a lower bound of what the run really uses: 10,000 workers of the default
model (1.8 M parameters) hold 148 GB of messages in flight with Flower; such a
run grew to 5.7 GB in 200 s without finishing two updates before this check.
On a GPU the states in device memory are counted as host memory: the estimate
errs towards refusing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fedlm.config import Config
from fedlm.data import tokenizer
from fedlm.errors import ConfigError
from fedlm.presets import PRESETS, parameter_count
from fedlm.sim import fleet, job_sizes
from fedlm.sim.room import available, process_room  # noqa: F401 (tests patch them here)

MIB = 1 << 20
STATES_KEPT = 1 << 30  # bytes of worker states the state writer keeps in memory, at most
PROCESS_BYTES = 400 * MIB  # Python, torch, the corpus: measured ~350 MB for a tiny run
RAY_BYTES = 500 * MIB  # Ray's GCS, raylet and dashboard agent
ACTOR_BYTES = 300 * MIB  # one ClientApp actor (Python, torch, the corpus)
SERVER_COPIES = 6  # weights, strategy state (momentum, ...), the versions jobs start from
# Bookkeeping per worker that does not grow with the model: Flower's node contexts
# and message metadata; in one process, the worker's profile, RNG and shard.
WORKER_BYTES = {"flower": 64 * 1024, "inprocess": 8 * 1024}


@dataclass(frozen=True)
class Estimate:
    total: int  # bytes
    parts: dict[str, int]  # what -> bytes, largest first
    nodes: int  # workers as the engine sees them
    in_flight: int  # jobs in flight at most
    per_job: int  # bytes a job in flight holds


def estimate(cfg: Config, backend: str = "flower", job_batches: int = 0) -> Estimate:
    """What a run of ``cfg`` on ``backend`` (flower | inprocess) holds in memory;
    ``job_batches``: the bytes of the largest job's batches (``job_sizes.check``), held
    by as many jobs as train at once."""
    model = 4 * parameter_count(cfg.model, cfg.data.seq_len,
                                tokenizer.vocab_size(cfg.data.tokenizer))  # fp32
    nodes = fleet.node_count(cfg)
    in_flight = min(nodes, cfg.max_in_flight or nodes)
    copies = 2 if backend == "flower" else 1  # the message down, the reply up
    per_job = copies * model
    parts = {"processes": PROCESS_BYTES, "the server's models": SERVER_COPIES * model,
             f"{in_flight} jobs in flight": in_flight * per_job,
             "per-worker bookkeeping": nodes * WORKER_BYTES.get(backend, 0)}
    actors = cfg.sim.ray_actors or min(nodes, cfg.sim.cpus or os.cpu_count() or 1)
    if job_batches:  # the jobs that train at once: the job threads, or Ray's actors
        training = min(in_flight, cfg.sim.job_threads if backend == "inprocess" else actors)
        parts["the largest jobs' batches"] = training * job_batches
    if backend == "flower":
        parts["processes"] += RAY_BYTES + actors * ACTOR_BYTES
    if cfg.state_store() != "disk":
        parts["AdamW states in memory (inner.state_store)"] = nodes * 2 * model
    elif backend == "inprocess":
        parts["AdamW states kept by the state writer"] = min(nodes * 2 * model,
                                                    max(STATES_KEPT, 2 * model))
    parts = dict(sorted(parts.items(), key=lambda kv: -kv[1]))
    return Estimate(sum(parts.values()), parts, nodes, in_flight, per_job)


def check_fits(cfg: Config, backend: str = "flower") -> Estimate:
    """``estimate``, or a one-line ``ConfigError`` saying how much the run needs, what
    takes most of it and what to change, when that is more than ``available()`` (in one
    process, ``inprocess``, also more than ``process_room()``)."""
    have = available()
    if backend == "inprocess":
        have = min(have, process_room())
    job_batches = job_sizes.check(cfg, min(have, process_room()))  # a derived job size, checked as typed ones are
    need = estimate(cfg, backend, job_batches)
    if need.total <= have:
        return need
    what, biggest = next(iter(need.parts.items()))
    advice = []
    if what.endswith("jobs in flight"):
        rest = need.total - biggest
        room = int(0.8 * have)  # some room for the rest
        fit = (room - rest) // need.per_job if room > rest else 0
        if fit >= 1:
            advice.append(f"max_in_flight={fit} (at most that many jobs at once)")
    if cfg.state_store() != "disk":
        advice.append("inner.state_store=disk")
    advice += ["fewer workers", "a smaller model"]
    raise ConfigError(f"memory: this run needs about {_size(need.total)} ({what}: "
                      f"{_size(biggest)}; {need.nodes} workers, {cfg.model} model), more than "
                      f"the {_size(have)} this machine has available; set "
                      + ", or ".join(advice))


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def gpu_bytes(cfg: Config) -> int:
    """What one in-process run of ``cfg`` holds in GPU memory, about: the server's models
    (``SERVER_COPIES``), per job thread a model's weights, gradients and two AdamW moments
    and its activations (a layer's ~16 values a token and model width, fp32), and the
    workers' states where they stay on the device (``inner.state_store = context``)."""
    params = parameter_count(cfg.model, cfg.data.seq_len,
                             tokenizer.vocab_size(cfg.data.tokenizer))
    n_layer, d_model = PRESETS[cfg.model][0], PRESETS[cfg.model][1]
    activations = 4 * 16 * cfg.inner.batch_size * cfg.data.seq_len * d_model * n_layer
    per_thread = 4 * 4 * params + activations
    states = fleet.node_count(cfg) * 2 * 4 * params if cfg.state_store() != "disk" else 0
    return SERVER_COPIES * 4 * params + cfg.sim.job_threads * per_thread + states


def check_gpu_jobs(cfgs: list[Config], jobs: int, free: int) -> None:
    """``jobs`` runs of the largest of ``cfgs`` at once on a GPU with ``free`` bytes, or a
    one-line ``ConfigError`` that says how many fit."""
    need = max(gpu_bytes(c) for c in cfgs)
    if jobs * need <= 0.9 * free:  # some room for the CUDA context and fragmentation
        return
    fits = max(1, int(0.9 * free // need))
    raise ConfigError(f"--jobs {jobs}: runs of up to {_size(need)} of GPU memory each, "
                      f"{_size(jobs * need)} at once, more than the {_size(free)} the GPU "
                      f"has free: --jobs {fits}" + ("" if fits > 1 else " (one at a time)"))
