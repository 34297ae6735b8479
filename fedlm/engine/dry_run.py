"""The engine's virtual clock alone: a dry run.

``InstantTransport`` answers every job the moment it is submitted with a zero outer
gradient (of the configured encoding), so nothing trains and only the virtual clock
matters; ``run_clock`` runs fedlm's real engine on a config with it, and ``simulate``
reads back what the planner predicts (``fedlm.plan.check`` compares the two). Tests
and benchmarks of the engine's timing use the transport too.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from fedlm.engine.loop import Engine
from fedlm.engine.types import JobResult
from fedlm.sim import compression, fleet
from fedlm.store.schema import EXPOSED_COMM_KINDS
from fedlm.strategies import registry
from fedlm.strategies.fragments import Streaming, fragment_names


class InstantTransport:
    """Every job done the moment it is submitted, with a zero outer gradient shaped
    like ``params`` (in the config's encoding): only the virtual clock matters."""

    def __init__(self, params, cfg) -> None:
        zeros = OrderedDict((k, torch.zeros_like(v)) for k, v in params.items())
        self.payload, _ = compression.encode(zeros, {}, cfg.network)
        stream = Streaming.of_config(cfg)  # a streaming job reports one fragment
        self.fragments = [] if stream is None else [
            compression.encode(OrderedDict((k, zeros[k]) for k in names), {}, cfg.network)[0]
            for names in fragment_names(list(zeros), stream.fragments)]
        self.ready: list = []

    def submit(self, job, params_) -> None:
        payload = self.payload if job.fragment < 0 else self.fragments[job.fragment]
        self.ready.append(JobResult(job.job_id, payload, steps=job.local_steps, tokens=1,
                                    train_loss=0.0))

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
    engine = Engine(cfg, strategy=registry.build_strategy(cfg.strategy, cfg.outer),
                    local_steps=registry.build_local_steps(cfg.local_steps),
                    transport=InstantTransport(zeros, cfg), fleet=fleet.node_profiles(cfg),
                    writer=spans)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: threads only get in each other's way
    try:
        engine.run(zeros)
    finally:
        torch.set_num_threads(threads)
    return engine, spans.seconds


def simulate(cfg, params: int) -> dict[str, float]:
    """``run_clock`` with a model of ``params`` fp32 values (one tensor, or one per
    fragment when streaming). Returns what the plan predicts: virtual seconds per new
    global model, and the shares of all workers' time spent computing, communicating
    (link waits included) and idle.
    """
    stream = Streaming.of_config(cfg)
    if stream is None:
        zeros = OrderedDict(w=torch.zeros(int(params)))
    else:  # one tensor per fragment, as blocks of layers (fedlm.strategies.fragments)
        p = stream.fragments
        zeros = OrderedDict((f"blocks.{i}.w", torch.zeros(int(params) // p)) for i in range(p))
    engine, sec = run_clock(cfg, zeros)
    total = engine.now * len(fleet.node_profiles(cfg))
    comm = sum(sec.get(k, 0.0) for k in EXPOSED_COMM_KINDS)
    return {"time_per_update": engine.now / engine.version, "virtual_time": engine.now,
            "updates": engine.version, "compute_utilisation": sec.get("compute", 0.0) / total,
            "comm_fraction": comm / total, "idle_fraction": sec.get("idle", 0.0) / total}
