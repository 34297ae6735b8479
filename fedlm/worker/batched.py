"""Several jobs as one computation: K workers' inner loops over stacked replicas.

    run_group([(θ_k, state_k, job_k) ...]) -> [Trained_k ...]   (as run_job, each)

Each job keeps what ``worker.train.run_job`` gives it: its start point, its AdamW
state and step count, its schedule position and learning rate, its data batches,
its number of steps. What they share is the computation: one forward, backward and
optimizer step per inner step for all of them (``fedlm.worker.stacked``,
``fedlm.worker.stacked_adamw``). Jobs of different H are ordered longest first:
at step s the replicas still training are a prefix, and a finished one is never
read or written again.

A replica's arithmetic does not depend on which other replicas share its batch,
nor on their number (a test checks it to the bit), so a job computes the same bits
alone as in any group: replay and resume run jobs in other groupings than the run
did and still end at its hash. It equals the per-job loop within rounding only
(batched matmuls sum in another order; ``TOLERANCE``).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
import torch

from fedlm import data, model as model_lib
from fedlm.config import Config
from fedlm.job import JobResult, JobSpec
from fedlm.shards import job_data, pod_size
from fedlm.sim import fleet
from fedlm.worker import precision, stacked
from fedlm.worker.stacked_adamw import StackedAdamW, clip_grad_norms
from fedlm.worker.train import Trained, encoded, inner_lr, mean_loss

# How far a batched run may land from the per-job loop's, as ‖batched − per job‖₂ over
# the whole model, relative to ‖per job‖₂ for a job's outer gradient, and to how far the
# per-job run moved the weights (‖θ_end − θ_start‖₂) for a run's final weights. fp32 on
# the CPU measured 2e-7 to 1e-6 (tiny and small, a group and whole runs of sync DiLoCo
# and DN + DyLU); bf16 (autocast: its roundings fall elsewhere) 1e-3 to 3e-3 per job.
TOLERANCE = 1e-4
BF16_TOLERANCE = 3e-2


def group_key(cfg: Config, job: JobSpec) -> tuple:
    """Jobs of equal keys train the same shapes and may share a computation."""
    return (cfg.inner.batch_size * pod_size(cfg, job.worker),)


def run_group(items: list[tuple[object, dict, JobSpec]], cfg: Config,
              state_on_device: bool = False, server_device: str = "cpu",
              device: str | None = None) -> list[Trained]:
    """Run jobs ``(params, opt_state, job)`` of one ``group_key`` together; their
    results in the order given. ``device``: where they train (one of the host's GPUs,
    ``fedlm.worker.placement``); None: the run's ``device``."""
    torch.set_num_threads(cfg.inner.threads)
    device = device or model_lib.resolve_device(cfg.device)
    order = sorted(range(len(items)), key=lambda i: -items[i][2].local_steps)  # stable
    jobs = [items[i][2] for i in order]
    starts = [precision.to_device(items[i][0], device) for i in order]
    states = [items[i][1] for i in order]
    names = list(starts[0])
    params = {n: torch.stack([s[n] for s in starts]) for n in names}  # trained in place
    lrs = [_learning_rates(job, st, cfg) for job, st in zip(jobs, states)]
    opt = StackedAdamW(params, cfg.inner, [_adam_steps(st, names) for st in states], lrs)
    for k, st in enumerate(states):
        opt.load(k, {n: (st[f"{n}/exp_avg"], st[f"{n}/exp_avg_sq"])
                     for n in names if f"{n}/exp_avg" in st})

    t0 = time.perf_counter()
    losses = _train(params, opt, jobs, cfg, device)
    seconds = time.perf_counter() - t0

    out: list[Trained | None] = [None] * len(items)
    total = max(1, sum(j.local_steps for j in jobs))
    for k, i in enumerate(order):
        share = seconds * jobs[k].local_steps / total  # the group's time, by steps
        out[i] = _finish(k, jobs[k], starts[k], states[k], params, opt, losses, share, cfg,
                         names, state_on_device, device, server_device)
    return out


def _adam_steps(state: dict, names: list[str]) -> int:
    """The AdamW steps a saved state has taken (0: fresh)."""
    key = f"{names[0]}/step"
    return int(state[key].item()) if key in state else 0


def _learning_rates(job: JobSpec, state: dict, cfg: Config) -> list[float]:
    """The job's learning rate at each of its steps: its schedule's, from where it
    stands (as ``run_job``: the server's position, or the worker's own)."""
    if job.schedule_step >= 0:
        start, horizon = job.schedule_step, cfg.schedule_horizon(fleet.node_count(cfg))
    else:
        start, horizon = int(state.get("schedule_step", 0)), cfg.decay_steps()
    return [inner_lr(start + s, cfg.inner, horizon) for s in range(job.local_steps)]


def _sequences(jobs: list[JobSpec], cfg: Config, device) -> torch.Tensor:
    """Every job's token rows, (H_max, K, B, T+1): job k's step s at [s, k]; the steps
    past a job's H are zeros and never read."""
    corpus = data.load_corpus(cfg.data)
    batch = cfg.inner.batch_size * pod_size(cfg, jobs[0].worker)
    longest = jobs[0].local_steps
    rows = np.zeros((longest, len(jobs), batch, corpus.train.shape[1]), dtype=np.int64)
    for k, job in enumerate(jobs):
        idx = data.job_batches(job_data(cfg, job), job.local_steps, batch, job.data_seed)
        rows[:job.local_steps, k] = corpus.train[idx]
    host = torch.from_numpy(rows)
    if torch.device(device).type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host


def _train(params: dict, opt: StackedAdamW, jobs: list[JobSpec], cfg: Config,
           device) -> torch.Tensor:
    """The inner steps of all jobs; each step's losses, (H_max, K) fp32 (zeros past a
    job's H)."""
    longest = jobs[0].local_steps
    losses = torch.zeros(longest, len(jobs), device=device)
    if longest == 0:
        return losses
    mcfg = model_lib.model_config(cfg.model, cfg.data.seq_len, data.vocab_size(cfg.data))
    mode = precision.resolve(cfg.inner.precision, str(device))
    seqs = _sequences(jobs, cfg, device)
    steps = [job.local_steps for job in jobs]
    with precision.matmul_scope(mode, device):
        for s in range(longest):
            active = sum(1 for h in steps if h > s)  # a prefix: longest jobs first
            rows = {n: p[:active].detach().requires_grad_() for n, p in params.items()}
            batch = seqs[s, :active]
            with precision.autocast(mode, device):
                loss = stacked.losses(rows, batch[..., :-1], batch[..., 1:], mcfg)
            loss.sum().backward()  # replica k's gradient is its own loss's
            if cfg.inner.grad_clip > 0:
                clip_grad_norms(rows, cfg.inner.grad_clip)
            opt.step(rows, active)
            losses[s, :active] = loss.detach().float()
    return losses


def _finish(k: int, job: JobSpec, start: dict, state: dict, params: dict,
            opt: StackedAdamW, losses: torch.Tensor, seconds: float, cfg: Config,
            names: list[str], state_on_device: bool, device,
            server_device: str = "cpu") -> Trained:
    """Replica ``k``'s result and new state, as ``run_job`` makes them."""
    with torch.no_grad():
        grad = OrderedDict((n, start[n] - params[n][k]) for n in names)
    if opt.steps[k] == 0:  # never stepped: torch's AdamW has no state yet either
        new_state = {}
    else:
        new_state = {f"{n}/{key}": v for n in names for key, v in opt.state_of(k, n).items()}
        if not state_on_device and torch.device(device).type != "cpu":
            new_state = dict(precision.to_host(new_state))
    new_state["schedule_step"] = int(state.get("schedule_step", 0)) + job.local_steps
    if not precision.same_device(device, server_device):  # on one device: stays there
        grad = precision.to_server(grad, device, server_device)  # as worker.train does
    batch = cfg.inner.batch_size * pod_size(cfg, job.worker)
    loss = mean_loss(losses[:job.local_steps, k]) if job.local_steps else 0.0
    result = JobResult(job.job_id, grad, job.local_steps,
                       job.local_steps * batch * cfg.data.seq_len, loss, seconds)
    return Trained(result, new_state)


def job_updates(items: list[tuple[object, dict, JobSpec]], cfg: Config,
                state_on_device: bool = False, server_device: str = "cpu",
                device: str | None = None) -> list[Trained]:
    """``run_group`` plus each outer gradient encoded for the wire, as
    ``worker.train.job_update`` does for one job."""
    trained = run_group(items, cfg, state_on_device, server_device, device)
    return [encoded(t, state, cfg, job) for (_, state, job), t in zip(items, trained)]
