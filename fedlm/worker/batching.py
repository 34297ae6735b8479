"""Which jobs train batched (``sim.batched``), and in which groups.

    off   every job on its own (``worker.train``): the reference bits
    on    every job that trains normally goes through ``worker.batched``, in groups
          of the jobs in flight together
    auto  on where it was measured faster (``resolve``: the CPU's and a GPU's
          rules), else off

The choice is made once per run, from its config (and the device it resolves to),
never per group: a job computes the same bits in any group, and alone (the test of
``worker.batched``), so replay and resume need only know the run's mode, which the
run log records (``KIND`` events). Jobs the batched path does not take, in a batched
run, run on their own as before: a streaming job (it mixes in fragments mid-job) and
a job with an injected fault that acts before or after training (crash, hang, a
corrupted update: its update is never applied, so replay never runs it).
"""

from __future__ import annotations

from fedlm.config import Config
from fedlm.job import JobSpec

KIND = "batched"  # the run-log event that records a run's mode: detail "on" or "off"

# Replicas in one computation, at most: the gain saturates by 8-16 replicas (tiny and
# small on the CPU, experiments/results/batched-cpu.json) while memory grows with each.
MAX_REPLICAS = 16


def faster_on_cpu(cfg: Config) -> bool:
    """Where batching measured faster on the CPU (experiments/results/batched-cpu-quiet.json,
    a quiet machine): the tiny model on sequences of up to 64 tokens, where the per-op
    cost of many small ops bounds the per-job loop (16 replicas at 4 x 64: 1.41x per
    inner step, 1.49x and 1.51x over whole sync DiLoCo and DN + DyLU runs). At 128
    tokens and for every larger model the matmuls and the attention bound both ways
    alike (tiny at 8 x 128: 1.01x per step, 1.03-1.08x per run; small 0.99-1.01x)."""
    return cfg.model == "tiny" and cfg.data.seq_len <= 64


def faster_on_gpu(cfg: Config) -> bool:
    """Where batching measured faster on a GPU (an H200: experiments/results/
    batched-h200.json): 16 workers of ``20m``, bf16, 5.15x per inner step, 2.64x over a
    whole sync DiLoCo run and 1.57x for DN + DyLU. A model that small leaves the GPU
    bound by kernel launches, and ``tiny`` and ``small`` more so. Not ``60m`` and
    ``150m``: not measured, their matmuls fill more of the device alone, and memory
    grows with every replica."""
    return cfg.model in ("tiny", "small", "20m")


def resolve(cfg: Config) -> bool:
    """Whether the in-process jobs of a run of ``cfg`` train batched."""
    mode = cfg.sim.batched
    if mode != "auto":
        return mode == "on"
    from fedlm.model import resolve_device  # torch: only when a run starts
    from fedlm.strategies.fragments import Streaming

    streaming = Streaming.of_config(cfg) is not None
    faster = faster_on_cpu(cfg) if resolve_device(cfg.device) == "cpu" else faster_on_gpu(cfg)
    return (faster and not cfg.inner.compile and not streaming and cfg.inner.optimizer == "adamw"
            and not (cfg.clock == "wall" and cfg.fleet.emulate_speed))


def batchable(job: JobSpec) -> bool:
    """A job the batched path trains (in a run that batches)."""
    return job.fragment < 0 and job.fault in ("", "duplicate")


def groups(items: list, key) -> list[list]:
    """``items`` (each with its ``.job``) in groups that share a computation: equal
    ``key(job)``, by job id, at most ``MAX_REPLICAS`` each."""
    by_key: dict = {}
    for item in sorted(items, key=lambda item: item.job.job_id):
        by_key.setdefault(key(item.job), []).append(item)
    return [group[i:i + MAX_REPLICAS] for group in by_key.values()
            for i in range(0, len(group), MAX_REPLICAS)]


def recorded(details: list[str]) -> bool | None:
    """The mode a run's log records (its ``KIND`` events' details): True if it trained
    batched, False if not, None if it says nothing (a Flower run; a run of an older
    fedlm: both trained every job on its own)."""
    return details[-1] == "on" if details else None


def detail(on: bool) -> str:
    return "on" if on else "off"


def split(group: list, parts: int) -> list[list]:
    """``group`` in at most ``parts`` near-equal runs (one per job thread: a group
    trained on one thread would leave the others idle)."""
    size = -(-len(group) // max(1, parts))
    return [group[i:i + size] for i in range(0, len(group), size)]
