"""The worker's job: H inner AdamW steps on a data shard, as a pure function.

    run_job(θ, optimizer state, job) -> (outer gradient, new optimizer state, metrics)

The ClientApp calls it inside Flower; replay and tests call it directly. What
a job reads is fixed by its ``data_seed``, and the inner optimizer's state
(AdamW moments, the schedule position) belongs to the worker, travels in and
out of this function, and is never sent to the server.

``serve_job`` is everything a worker does with a job message around that:
load the state the job names, act out an injected fault, run, save the new
state, emulate a slower device on the wall clock.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch

from fedlm.sim import compression, faults, fleet, link_codecs
from fedlm import data, model as model_lib
from fedlm.shards import data_shards, job_data, pod_size
from fedlm.worker import optimizers, precision, streaming
from fedlm.config import Config, InnerConfig
from fedlm.job import JobResult, JobSpec
from fedlm.model import load_into


class Trained(NamedTuple):
    """A job run on a worker: what goes back to the server, and the worker's new
    inner-optimizer state (which stays on the worker)."""

    result: JobResult
    opt_state: dict


def inner_lr(step: int, cfg: InnerConfig, decay_steps: int) -> float:
    """Linear warmup to ``cfg.lr``, then cosine decay to ``min_lr_ratio × lr``.

    ``step`` is the schedule's position over the whole run (``inner.schedule``:
    the worker's own inner steps, its shard's, or the run's), so the schedule
    continues across jobs instead of restarting every job.
    """
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, decay_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.min_lr_ratio
    return cfg.lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


# -- per-process caches (read-only or scratch; never per-node state) ----------

_THREAD = threading.local()


def _scratch_model(preset: str, block_size: int, device: str,
                   vocab_size: int = data.VOCAB_SIZE) -> model_lib.GPT:
    """This thread's scratch model: weights are overwritten by every job, only the
    structure is reused. One per thread, since jobs of several threads may train
    at once (``sim.job_threads``)."""
    models = _THREAD.__dict__.setdefault("models", {})
    key = (preset, block_size, device, vocab_size)
    if key not in models:
        if len(models) >= 2:
            models.clear()
        models[key] = model_lib.blank(preset, block_size, device=device,
                                      vocab_size=vocab_size)
    return models[key]


def warm_up(cfg: Config) -> None:
    """Load the corpus, the shards and the scratch model into this process's caches,
    so the first job does not pay for them (called on the partition query)."""
    data_shards(cfg.data, cfg.shard_count(), cfg.seed)
    _scratch_model(cfg.model, cfg.data.seq_len, model_lib.resolve_device(cfg.device),
                   data.vocab_size(cfg.data))


# -- optimizer state <-> flat tensor dict ----------------------------------------

def _export_opt_state(opt: torch.optim.Optimizer, names: list[str],
                      on_device: bool = False) -> dict[str, torch.Tensor]:
    """The optimizer's state as name/key -> tensor: the optimizer's own tensors where
    they are on the host, or with ``on_device`` where they are (the optimizer is
    discarded after the job, so they are the job's to hand on: no copy), else host
    copies."""
    flat: dict[str, torch.Tensor] = {}
    state = opt.state_dict()["state"]
    for idx, name in enumerate(names):
        for key, value in state.get(idx, {}).items():
            flat[f"{name}/{key}"] = value
    if on_device or all(v.device.type == "cpu" for v in flat.values()):
        return flat
    return dict(precision.to_host(flat))  # one synchronisation on CUDA, not one per tensor


def _import_opt_state(opt: torch.optim.Optimizer, names: list[str],
                      flat: dict[str, torch.Tensor], device: str) -> None:
    if not flat:
        return
    sd = opt.state_dict()
    sd["state"] = {}
    for idx, name in enumerate(names):
        entry = {k.split("/", 1)[1]: v for k, v in flat.items() if k.split("/", 1)[0] == name}
        if entry:
            sd["state"][idx] = {k: (v if k == "step" else v.to(device)) for k, v in entry.items()}
    opt.load_state_dict(sd)  # moves "step" to the device itself where fused AdamW wants it


def _upload(rows: np.ndarray, device: torch.device) -> torch.Tensor:
    """Token rows as int64 on ``device``: pinned and asynchronous on CUDA."""
    host = torch.from_numpy(rows.astype(np.int64))
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def train_steps(net, opt: torch.optim.Optimizer, batches: np.ndarray, lr_at,
                cfg: Config, forward=None, before_step=None) -> torch.Tensor:
    """AdamW steps on ``net``, one per row of ``batches`` (sequence indices), step
    s at learning rate ``lr_at(s)``; returns the training losses as a 1-D fp32
    tensor on the device (read it once: no host synchronisation per step).

    ``forward`` is what computes (logits, loss) — ``net`` itself, or its compiled
    form (``precision.compiled``), which shares its parameters. Forward + loss run
    under ``inner.precision`` (bf16: autocast; the weights and AdamW state stay fp32).
    ``before_step(s)``, if given, runs before step s (Streaming DiLoCo's mix-in).
    """
    corpus = data.load_corpus(cfg.data)
    device = next(net.parameters()).device
    mode = precision.resolve(cfg.inner.precision, str(device))
    forward = forward if forward is not None else net
    net.train()
    if len(batches) == 0:
        return torch.zeros(0, device=device)
    # Every step's sequences go to the device in one copy: (steps, B, T+1).
    seqs_all = _upload(corpus.train[np.asarray(batches).reshape(-1)], device)
    seqs_all = seqs_all.view(len(batches), -1, seqs_all.shape[-1])
    losses = []
    with precision.matmul_scope(mode, device):
        for s in range(len(batches)):
            if before_step is not None:
                before_step(s)
            for group in opt.param_groups:
                group["lr"] = lr_at(s)
            seqs = seqs_all[s]  # (B, T+1)
            with precision.autocast(mode, device):
                _, loss = forward(seqs[:, :-1], seqs[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.inner.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.inner.grad_clip)
            opt.step()
            losses.append(loss.detach().float())
    return torch.stack(losses)


def new_optimizer(net, cfg: Config) -> torch.optim.Optimizer:
    """The job's inner optimizer (``inner.optimizer``, ``fedlm.worker.optimizers``)."""
    i = cfg.inner
    if i.optimizer != "adamw":
        return optimizers.build(i.optimizer, list(net.named_parameters()), i)
    return adamw(net, cfg)


def adamw(net, cfg: Config) -> torch.optim.AdamW:
    """AdamW with the ``[inner]`` settings (lr, betas, weight decay): the inner optimizer
    by default, and pretraining's whatever ``inner.optimizer`` names."""
    i = cfg.inner
    device = next(net.parameters()).device
    extra = {"fused": True} if precision.fused_adamw(device) else {}
    return torch.optim.AdamW(net.parameters(), lr=i.lr, betas=(i.beta1, i.beta2),
                             weight_decay=i.weight_decay, **extra)


def model_forward(net, cfg: Config, device: str):
    """``net``, or with ``inner.compile`` its compiled form (built once per process)."""
    if not cfg.inner.compile:
        return net
    mode = precision.resolve(cfg.inner.precision, device)
    return precision.compiled(net, (cfg.model, cfg.data.seq_len, device, mode))


def mean_loss(losses: torch.Tensor) -> float:
    """The job's reported training loss: the float64 mean of its steps' fp32 losses,
    read from the device once."""
    values = losses.cpu().numpy().astype(np.float64)
    return float(np.mean(values)) if len(values) else float("nan")


def run_job(params, opt_state: dict, job: JobSpec, cfg: Config,
            state_on_device: bool = False, server_device: str = "cpu",
            device: str | None = None) -> Trained:
    """Run one job; pure in (params, opt_state, job, cfg) for a fixed thread count.

    On a GPU the job's work stays on the device: its start point goes there in one
    batch of pinned asynchronous copies and is kept there, the outer gradient
    θ_start − θ_end is computed there (fp32 subtraction: the same bits as on the
    host), and the gradient and the losses come back in one batch of pinned
    asynchronous copies at the end. The AdamW state comes back to the host too,
    unless ``state_on_device`` (the worker keeps it in device memory for its next
    job: the in-process backend); either way the bits are the same. The outer
    gradient stays where the server keeps the global model (``server_device``: the
    run's device in process, where the engine, the outer step and the store's digest
    read it; the host under Flower, where it goes on the wire). ``device``: where the job
    runs (``fedlm.worker.placement``: one of the host's GPUs); None: the run's ``device``.
    """
    import time

    torch.set_num_threads(cfg.inner.threads)
    device = device or model_lib.resolve_device(cfg.device)
    net = _scratch_model(cfg.model, cfg.data.seq_len, device, data.vocab_size(cfg.data))
    names = [n for n, _ in net.named_parameters()]
    stream = streaming.WorkerStream(job, opt_state, params, names, cfg, device)
    start_params = stream.start if stream.on else precision.to_device(params, device)
    load_into(net, start_params)

    opt = new_optimizer(net, cfg)
    opt_names = optimizers.state_names(opt, net)  # AdamW: ``names``, in the model's order
    tensors = {k: v for k, v in opt_state.items() if k != "schedule_step"}
    _import_opt_state(opt, opt_names, tensors, device)
    own_step = int(opt_state.get("schedule_step", 0))  # the worker's own inner steps so far
    if job.schedule_step >= 0:  # the server placed the job on a shard's or the run's schedule
        start, horizon = job.schedule_step, cfg.schedule_horizon(fleet.node_count(cfg))
    else:
        start, horizon = own_step, cfg.decay_steps()

    # A pod of k workers trains data-parallel: one step on k workers' batches at once.
    batch_size = cfg.inner.batch_size * pod_size(cfg, job.worker)
    batches = data.job_batches(job_data(cfg, job), job.local_steps, batch_size, job.data_seed)
    t0 = time.perf_counter()
    if stream.on and not job.local_steps:  # a flushing round: mix in, report, no step
        stream.mix_hook(net)(job.mix_step)
    losses = train_steps(net, opt, batches, lambda s: inner_lr(start + s, cfg.inner, horizon),
                         cfg, forward=model_forward(net, cfg, device),
                         before_step=stream.mix_hook(net) if stream.on else None)
    # the job's one read of the losses (waits for the device); a job of no steps has none
    train_loss = mean_loss(losses) if job.local_steps else 0.0
    seconds = time.perf_counter() - t0

    new_state = _export_opt_state(opt, opt_names, on_device=state_on_device)
    new_state["schedule_step"] = own_step + job.local_steps
    with torch.no_grad():
        end = dict(net.named_parameters())
        if stream.on:  # the reported fragment against its last global value
            grad = stream.outer_gradient(end)
            new_state.update(stream.kept(end, state_on_device))
        else:
            grad = OrderedDict((k, start_params[k] - end[k].detach()) for k in start_params)
    if not precision.same_device(device, server_device):  # on one device: stays there
        grad = precision.to_server(grad, device, server_device)
    result = JobResult(job.job_id, grad, job.local_steps,
                       job.local_steps * batch_size * cfg.data.seq_len, train_loss, seconds)
    return Trained(result, new_state)


def job_update(params, state: dict, job: JobSpec, cfg: Config,
               state_on_device: bool = False, server_device: str = "cpu",
               device: str | None = None) -> Trained:
    """``run_job`` plus encoding its outer gradient for the wire (``fedlm.sim.compression``):
    the result's ``outer_grad`` is the payload, the new ``opt_state`` carries the
    error-feedback tensors on. Replay calls this too."""
    return encoded(run_job(params, state, job, cfg, state_on_device, server_device, device),
                   state, cfg, job)


def encoded(trained: Trained, state: dict, cfg: Config, job: JobSpec) -> Trained:
    """``job``'s trained outer gradient encoded for the wire (its link's encoding), the
    error-feedback tensors of ``state`` (the one it started from) carried on in its new
    state."""
    result, new_state = trained
    payload, errors = compression.encode(result.outer_grad, state,
                                         link_codecs.network_of(cfg.network, job))
    # a streaming job encodes one fragment: the other fragments' errors carry on
    carried = {k: v for k, v in state.items()
               if k.startswith(compression.EF_PREFIX) and k not in errors}
    return Trained(replace(result, outer_grad=payload), {**new_state, **carried, **errors})


def serve_job(params, states, job: JobSpec, cfg: Config,
              step_time: float | None = None, server_device: str = "cpu",
              device: str | None = None) -> JobResult:
    """A worker's whole handling of one job, the same under Flower and in process.

    ``states`` is the worker's state store (``fedlm.worker.states``);
    ``step_time`` its seconds per step if the node was told (deployment),
    else the profile's; ``server_device`` where the global model lives and ``device``
    where the job runs (``run_job``).
    """
    import time

    faults.before_job(job.fault, cfg)
    result, new_state = job_update(params, states.load(job.prev_job), job, cfg,
                                   state_on_device=getattr(states, "device_resident", False),
                                   server_device=server_device, device=device)
    states.save(job.job_id, new_state)
    states.prune(job.keep_from)
    seconds = result.compute_seconds
    if cfg.clock == "wall" and cfg.fleet.emulate_speed:
        # Pad the compute so a worker configured k times slower than the fastest
        # really takes k times as long (one machine can show real stragglers).
        times = [p.step_time for p in fleet.node_profiles(cfg)]
        mine = step_time if step_time is not None else times[job.worker]
        padded = seconds * mine / min(times)
        time.sleep(max(0.0, padded - seconds))
        seconds = padded
    return replace(result, outer_grad=faults.corrupt(result.outer_grad, job.fault),
                   compute_seconds=seconds)
