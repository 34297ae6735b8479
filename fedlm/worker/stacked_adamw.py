"""AdamW and grad-norm clipping over K stacked replicas, each with its own state.

torch's AdamW (the per-job loop's, single-tensor on the CPU) and
``clip_grad_norm_`` written over tensors with a leading replica dimension: replica
k has its own moments, its own step count (so its own bias correction) and its own
learning rate; the clipping norm is each replica's own global norm. The per-element
arithmetic follows torch's (``param ← param·(1 − lr·wd)``, ``lerp`` for the first
moment, ``exp_avg · (−step_size) / denom`` as ``addcdiv`` computes it), with the
per-replica scalars computed in Python doubles as torch does, then rounded to fp32.

Only a prefix of the replicas steps (``active``): the replicas are ordered by how
many steps their jobs take, so those whose jobs are done are the tail and are not
touched (their rows are not even read).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedlm.config import InnerConfig

EPS = 1e-8  # torch.optim.AdamW's default


class StackedAdamW:
    def __init__(self, params: dict[str, torch.Tensor], cfg: InnerConfig, steps: list[int],
                 lrs: list[list[float]]) -> None:
        """``params``: name -> (K, *shape); ``steps``: each replica's AdamW steps so far;
        ``lrs[k]``: replica k's learning rate at each of its steps to come."""
        self.cfg = cfg
        self.exp_avg = {n: torch.zeros_like(p) for n, p in params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in params.items()}
        self.steps = list(steps)
        self.taken = 0  # steps of this call so far
        device = next(iter(params.values())).device
        # every step's per-replica scalars in one upload: no host round trip per step
        self.scalars = _scalar_table(cfg, steps, lrs, device)

    def load(self, k: int, moments: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Replica ``k``'s moments (name -> (exp_avg, exp_avg_sq)) from its saved state."""
        with torch.no_grad():
            for name, (m, v) in moments.items():
                self.exp_avg[name][k].copy_(m)
                self.exp_avg_sq[name][k].copy_(v)

    def step(self, params: dict[str, torch.Tensor], active: int) -> None:
        """The next AdamW step of replicas ``0..active-1`` (each at its own learning rate
        and step count); ``params`` are those replicas' rows (leaf views with ``.grad``)."""
        c = self.cfg
        per_replica = self.scalars[:, self.taken, :active]  # (3, active)
        self.taken += 1
        for k in range(active):
            self.steps[k] += 1
        with torch.no_grad():
            for name, p in params.items():
                decay, neg_step, bc2_sqrt = per_replica.view(3, active, *[1] * (p.dim() - 1))
                g = p.grad
                m, v = self.exp_avg[name][:active], self.exp_avg_sq[name][:active]
                if c.weight_decay != 0:
                    p.mul_(decay)
                m.lerp_(g, 1 - c.beta1)
                v.mul_(c.beta2).addcmul_(g, g, value=1 - c.beta2)
                denom = (v.sqrt() / bc2_sqrt).add_(EPS)
                p.add_(m * neg_step / denom)

    def state_of(self, k: int, name: str) -> dict[str, torch.Tensor]:
        """Replica ``k``'s state of tensor ``name`` as torch's AdamW keeps it."""
        return {"step": torch.tensor(float(self.steps[k])),
                "exp_avg": self.exp_avg[name][k].clone(),
                "exp_avg_sq": self.exp_avg_sq[name][k].clone()}


def _scalar_table(cfg: InnerConfig, steps: list[int], lrs: list[list[float]],
                  device) -> torch.Tensor:
    """(3, H_max, K) fp32: at step s of replica k, 1 − lr·wd, −lr / bias_correction1 and
    √bias_correction2, each computed in double as torch's AdamW does (past a replica's
    last step: 1, 0, 1, never read)."""
    longest = max((len(x) for x in lrs), default=0)
    table = np.zeros((3, longest, len(lrs)))  # float64: Python's doubles, exactly
    table[0] = table[2] = 1.0
    for k, (done, rates) in enumerate(zip(steps, lrs)):
        for s, lr in enumerate(rates):
            step = done + s + 1
            table[:, s, k] = (1 - lr * cfg.weight_decay, -(lr / (1 - cfg.beta1 ** step)),
                              math.sqrt(1 - cfg.beta2 ** step))
    return torch.from_numpy(table).to(device=device, dtype=torch.float32)


def clip_grad_norms(params: dict[str, torch.Tensor], max_norm: float) -> None:
    """``clip_grad_norm_`` per replica: each replica's gradients scaled by
    min(1, max_norm / (its global L2 norm + 1e-6))."""
    grads = [p.grad for p in params.values()]
    k = grads[0].shape[0]
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(k, -1), dim=1) for g in grads], 1)
    total = torch.linalg.vector_norm(norms, dim=1)  # (K,)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.view(k, *[1] * (g.dim() - 1)))
