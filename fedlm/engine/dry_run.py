"""The engine's virtual clock alone: a dry run.

``InstantTransport`` answers every job the moment it is submitted with a zero outer
gradient (of the configured encoding), so nothing trains and only the virtual clock
matters; ``run_clock`` runs fedlm's real engine on a config with it (``fedlm.plan.check``
reads back what the planner predicts and compares). Tests and benchmarks of the
engine's timing use the transport too.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from fedlm.engine.assembly import assemble
from fedlm.engine.loop import Engine
from fedlm.engine.types import JobResult
from fedlm.sim import compression


class InstantTransport:
    """Every job done the moment it is submitted, with a zero outer gradient (in the
    config's encoding): only the virtual clock matters. The reply is shaped like
    ``reference(job)`` (the run's server's ``reference``: ``run_clock`` sets it), or
    like ``params`` when nothing else is given."""

    def __init__(self, params, cfg, reference=None) -> None:
        self.network = cfg.network
        self.reference = reference or (lambda job: params)
        self.replies: dict[tuple, object] = {}  # tensor names -> the encoded zero reply
        self.ready: list = []

    def submit(self, job, params_) -> None:
        shape = self.reference(job)
        names = tuple(shape)
        if names not in self.replies:
            zeros = OrderedDict((k, torch.zeros_like(v)) for k, v in shape.items())
            self.replies[names] = compression.encode(zeros, {}, self.network)[0]
        self.ready.append(JobResult(job.job_id, self.replies[names], steps=job.local_steps,
                                    tokens=1, train_loss=0.0))

    def collect(self, timeout: float) -> list:
        out, self.ready = self.ready, []
        return out


class _Spans:
    """A run writer that keeps only the seconds of each kind of worker interval."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add_intervals(self, rows) -> None:
        for _, kind, t0, t1, *_ in rows:
            key = getattr(kind, "value", kind)
            self.seconds[key] = self.seconds.get(key, 0.0) + (t1 - t0)

    def __getattr__(self, name):  # every other call of the engine's writer
        return lambda *a, **k: None


def run_clock(cfg, zeros) -> tuple[Engine, dict[str, float]]:
    """Run fedlm's real engine on ``cfg`` from the tensors ``zeros`` with a transport
    that answers every job at once with a zero outer gradient, so that only the
    virtual clock matters; returns the engine (its ``now`` and ``version``) and the
    seconds of each kind of interval, summed over the workers."""
    spans = _Spans()
    transport = InstantTransport(zeros, cfg)
    engine = assemble(cfg, transport=transport, writer=spans)
    transport.reference = engine.server.reference  # what the run's server compares to
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: threads only get in each other's way
    try:
        engine.run(zeros)
    finally:
        torch.set_num_threads(threads)
    return engine, spans.seconds
