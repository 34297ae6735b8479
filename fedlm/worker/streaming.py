"""A Streaming DiLoCo job on the worker (``fedlm.strategies.fragments``).

In a streaming run the worker keeps its own parameters from job to job: the
server sends only the global fragments it lacks, and the job mixes them in at
inner step ``job.mix_step`` (τ: the steps the exchange overlaps),

    θ_p ← α·θ_p^global + (1 − α)·θ_p       (α = ``stream.mix``; α = 1: a copy)

and reports one fragment's outer gradient against the global value it last
received: Δ_p = θ_p^global − θ_p^end. Between jobs the worker's state (the
store that also keeps its AdamW moments, ``fedlm.worker.states``) holds

    local/<name>   its parameters at the end of its last job
    ref/<name>     the global value of each tensor as it last received it

A worker's first job has neither: the server sends the whole model, which is
both its start and its reference. A job with ``fragment = -1`` is not
streaming (the whole model each job), and this module stays out of it.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from fedlm.job import JobSpec
from fedlm.strategies.fragments import Streaming, fragment_names
from fedlm.worker import precision

LOCAL, REF = "local/", "ref/"


class WorkerStream:
    def __init__(self, job: JobSpec, state: dict, payload, names: list[str], cfg,
                 device) -> None:
        self.on = job.fragment >= 0
        if not self.on:
            return
        settings = Streaming.of_config(cfg)
        self.alpha = settings.mix
        self.mix_step = job.mix_step
        self.report = fragment_names(names, settings.fragments)[job.fragment]
        local = {k[len(LOCAL):]: v for k, v in state.items() if k.startswith(LOCAL)}
        ref = {k[len(REF):]: v for k, v in state.items() if k.startswith(REF)}
        sent = precision.to_device(payload, device)
        if not local:  # the first job: the whole global model, start and reference alike
            missing = [n for n in names if n not in sent]
            if missing:
                raise ValueError(f"a worker's first streaming job needs the whole model; "
                                 f"{len(missing)} tensors missing ({missing[0]}, ...)")
            self.start = OrderedDict((n, sent[n]) for n in names)
            self.ref = OrderedDict(self.start)
            self.incoming: OrderedDict = OrderedDict()
        else:
            self.start = precision.to_device(OrderedDict((n, local[n]) for n in names), device)
            self.ref = precision.to_device(OrderedDict((n, ref[n]) for n in names), device)
            self.incoming = sent  # the global fragments to mix in at mix_step
            if sent and not 0 <= self.mix_step < max(1, job.local_steps):
                raise ValueError(f"job {job.job_id}: mix step {self.mix_step} is not one of "
                                 f"its {job.local_steps} inner steps")

    def mix_hook(self, net):
        """``before_step`` for ``train_steps``: mix the incoming fragments in at τ."""
        params = dict(net.named_parameters())

        def before_step(s: int) -> None:
            if s != self.mix_step or not self.incoming:
                return
            with torch.no_grad():
                for name, g in self.incoming.items():
                    if self.alpha == 1.0:
                        params[name].copy_(g)
                    else:
                        params[name].mul_(1.0 - self.alpha).add_(g, alpha=self.alpha)
                    self.ref[name] = g
        return before_step

    def outer_gradient(self, end: dict) -> "OrderedDict[str, torch.Tensor]":
        """Δ = reference − end for the tensors of the fragment this job reports."""
        return OrderedDict((k, self.ref[k] - end[k].detach()) for k in self.report)

    def kept(self, end: dict, on_device: bool) -> dict:
        """What the worker keeps for its next job: its parameters and references."""
        local = OrderedDict((LOCAL + k, v.detach().clone()) for k, v in end.items())
        ref = OrderedDict((REF + k, v) for k, v in self.ref.items())
        out = {**local, **ref}
        if on_device:
            return out
        return dict(precision.to_host(out))
