"""The values the run configuration's string settings choose from (``fedlm.config``
reads them, and re-exports each as ``config.NAME``). Standard library only."""

from __future__ import annotations

# How outer gradients may travel (fedlm.sim.compression).
COMPRESSIONS = ("fp32", "bf16", "fp16", "int8", "int4")
# How outer gradients are exchanged (fedlm.sim.collectives.TOPOLOGIES, a test checks).
TOPOLOGIES = ("star", "ring", "tree", "hierarchical")

# Inner learning-rate schedules (InnerConfig.schedule) and shard choices (DataConfig).
SCHEDULES = ("worker", "shard", "global")
SHARD_CHOICES = ("fixed", "paper")

# Arithmetic of the inner loop (InnerConfig.precision; docs/gpu.md): auto = bf16 on a
# CUDA device that supports it, fp32 elsewhere (CPU, where the determinism tests run).
PRECISIONS = ("auto", "fp32", "tf32", "bf16")

# The grace rules by name (Config.grace also takes a number of seconds).
GRACE_RULES = ("auto", "adaptive", "off")

# Where the inner loop runs (Config.device), and the order results are applied in
# (Config.clock: virtual = simulated-completion order, wall = real arrival order).
DEVICES = ("auto", "cpu", "cuda")
CLOCKS = ("virtual", "wall")

# Where a worker keeps its optimizer states (InnerConfig.state_store) and how the
# corpus is split over shards (DataConfig.partition).
STATE_STORES = ("auto", "context", "disk")
PARTITIONS = ("iid", "by-play", "dirichlet")

# Experiment trackers a run's metrics can also go to (TrackConfig; fedlm.track), and
# how W&B runs (offline: files only; online: a W&B login and the network).
TRACKERS = ("tensorboard", "mlflow", "wandb")
WANDB_MODES = ("offline", "online")

# How the in-process backend trains jobs in flight together (SimConfig.batched;
# fedlm.worker.batching): as one computation over stacked replicas, or one by one.
BATCH_MODES = ("auto", "on", "off")

# Per-job fault kinds of the [faults] section (at most one per job), in draw order.
FAULT_KINDS = ("crash", "hang", "nan", "bad_shape", "bad_dtype", "bad_size", "duplicate")
