"""The run configuration's schema: what a run is made of, with every default.

Frozen dataclasses, one per TOML section, each default with a one-line comment (the
values their string settings choose from: ``fedlm.config.choices``); and the few
quantities derived from a config alone. Reading a TOML file and ``--set`` overrides, type checks,
and validation against the model presets, fleet regions and strategy registry
live one layer up, in ``fedlm.config_load``: code past it may trust a ``Config``.

Standard library only (and ``fedlm.errors``, ``fedlm.config.choices``,
``fedlm.config.server``), so that any module may import it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from fedlm.config.choices import (  # noqa: F401 - read as config.X, as before
    COMPRESSIONS, TOPOLOGIES, SCHEDULES, SHARD_CHOICES, PRECISIONS, GRACE_RULES,
    DEVICES, CLOCKS, STATE_STORES, PARTITIONS, TRACKERS, WANDB_MODES, BATCH_MODES,
    FAULT_KINDS)
from fedlm.config.server import ServerConfig
from fedlm.errors import ConfigError  # noqa: F401  (re-exported: the error of a bad config)


@dataclass(frozen=True)
class InnerConfig:
    """The worker's job: H local AdamW steps on its own shard."""

    steps: int = 30  # H, local (inner) steps per job
    batch_size: int = 8  # sequences per inner step
    lr: float = 3e-3  # peak AdamW learning rate
    warmup_steps: int = 20  # linear warmup, counted in the schedule's own steps
    decay_steps: int = 0  # cosine horizon in the schedule's steps; 0 = auto (see Config)
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    # Whose progress the warmup + cosine follows (docs/async_local_sgd.md):
    # worker (each worker's own inner steps) | shard (the steps trained on the job's data
    # shard, whichever worker trained them: the paper's) | global (all inner steps of the run).
    schedule: str = "worker"
    weight_decay: float = 0.1  # AdamW decoupled weight decay
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # clip the global grad norm to this; 0 disables
    threads: int = 1  # torch intra-op threads per worker (bit-exactness needs it fixed)
    # Where a worker keeps its AdamW states: context (Flower's per-node memory) | disk
    # (node-local files; survive a crash, so resume needs them) | auto (disk when
    # reliability.checkpoint_every > 0, else context).
    state_store: str = "auto"
    # Inner-loop arithmetic (docs/gpu.md): auto | fp32 | tf32 (TF32 matmuls on CUDA; fp32 on
    # CPU) | bf16 (autocast around forward + loss; fp32 weights and AdamW state).
    precision: str = "auto"
    compile: bool = False  # torch.compile the model (once per process, reused across jobs)
    # The inner optimizer (fedlm/worker/optimizers.py): adamw (the settings above) |
    # package.module:name, a factory (parameters, inner) -> torch.optim.Optimizer.
    optimizer: str = "adamw"


@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from and how it is split across workers."""

    source: str = "shakespeare"  # "shakespeare" | "hf:NAME" | "text:GLOB"
    hf_config: str = ""  # dataset config name for hf: sources (e.g. "en" for allenai/c4)
    hf_split: str = "train"  # split to stream for hf: sources
    max_documents: int = 2000  # documents taken from an hf: stream
    text_column: str = "text"  # column holding the text in hf: sources
    partition: str = "by-play"  # one of PARTITIONS
    shards: int = 0  # data shards the training data is split into; 0 = one per worker
    # Which shard a job trains: fixed (worker w always shard w) | paper (a free worker
    # draws an under-sampled shard, fedlm.shards; the delayed-Nesterov paper's rule).
    shard_choice: str = "fixed"
    alpha: float = 0.5  # Dirichlet concentration over genres (smaller = more skewed)
    seq_len: int = 128  # tokens per training sequence (context length)
    val_fraction: float = 0.05  # tail of every document held out for validation
    # "byte" (one id per UTF-8 byte, vocab 256) | "bpe:V" (a byte-level BPE of V ids,
    # 257..65536, trained on the training split only, cached; fedlm.data.tokenizer).
    # The model's vocabulary follows. Perplexity is per token, so runs of different
    # tokenizers compare by bits per byte (reported with it).
    tokenizer: str = "byte"


@dataclass(frozen=True)
class InitConfig:
    """Where the federated phase starts (fedlm.start): a fresh model, another run's
    weights, and/or K steps of one worker on all the training data first."""

    # Weights to start from: "" (fresh, seeded) | RUN_ID (a finished run of this store)
    # | DB:RUN_ID (of another store) | PATH (a weights file or a checkpoint).
    # Spelt `from` in TOML and --set.
    from_: str = ""
    pretrain_steps: int = 0  # then K synchronous single-worker steps on all training data


@dataclass(frozen=True)
class EvalConfig:
    """Validation of the global model on the server."""

    every: int = 2  # evaluate every E outer updates (and at start and end)
    batches: int = 8  # validation batches per evaluation (fixed, first ones)
    batch_size: int = 16  # sequences per validation batch
    # Stop the run as diverged when validation loss is NaN/inf or above this factor times
    # its best so far (0 = only NaN/inf). On loss (nats), not perplexity: 3x the loss is
    # perplexity cubed. Healthy tiny-model runs spiked to at most 2x and recovered; from
    # a fresh model (ln 256 = 5.5) it takes 16.6; blow-ups measured 5x and more.
    diverge_factor: float = 3.0


@dataclass(frozen=True)
class FleetConfig:
    """Hardware and network profile of the simulated workers."""

    preset: str = "moderate"  # homogeneous | slight | moderate | very | paper-toy | geo | halos
    base_step_time: float = 1.0  # virtual seconds per inner step of a speed-1 worker
    jitter: float = 0.05  # sigma of the lognormal multiplier on each job's compute time
    step_times: list[float] = field(default_factory=list)  # explicit s/step per worker
    regions: list[str] = field(default_factory=list)  # explicit region per worker
    # Geo topology: workers per region, in order, e.g. {us = 4, eu = 2, asia = 2}
    # (must add up to `workers`; overrides the preset's and `regions`' placement).
    topology: dict[str, Any] = field(default_factory=dict)
    # Extra regions: name -> {latency = s, down_bw = bytes/s, up_bw = bytes/s}.
    links: dict[str, Any] = field(default_factory=dict)
    # A measured network (fedlm/sim/geo.py): {regions = [names], gbit = [[Gbit/s from row
    # to column]], latency = [[s]]}; the server sits in the first region. The halos
    # preset brings HALoS's.
    matrix: dict[str, Any] = field(default_factory=dict)
    # Wall clock only: a worker pads each job's compute so that it really takes
    # step_time / (fastest step_time) times as long as on the fastest worker.
    emulate_speed: bool = False
    # A fleet that changes over time (fedlm/sim/dynamics.py; virtual clock only):
    # a two-state slow-down per worker, {factor = 4, normal = 3600, slow = 600} (mean
    # seconds in each state; workers = [...] or regions = [...] to pick who, else all)
    slowdown: dict[str, Any] = field(default_factory=dict)
    # heavy-tailed stragglers: a job's compute x Pareto(alpha) >= factor with probability p,
    # {p = 0.05, factor = 5, alpha = 1.5, max = 100} (workers / regions as above)
    stragglers: dict[str, Any] = field(default_factory=dict)
    # absences from a seeded process, {up = 3600, down = 600} mean seconds (workers / regions)
    availability: dict[str, Any] = field(default_factory=dict)
    join: list[float] = field(default_factory=list)  # when each worker joins (0: at the start)
    leave: list[float] = field(default_factory=list)  # when it leaves for good (0: never)
    # FedScale-format traces (fedlm/sim/traces.py, docs/traces.md): per client, compute ms
    # per sample and kbit/s (setting each worker's step time and links), and availability
    # windows; trace times x trace_time_scale are run seconds
    device_trace: str = ""
    availability_trace: str = ""
    trace_time_scale: float = 1.0


@dataclass(frozen=True)
class NetworkConfig:
    """The server's shared links, a daily bandwidth cycle, and what uploads are encoded as."""

    server_down: float = 0.0  # server egress, bytes/s, shared by all downloads (0: unlimited)
    server_up: float = 0.0  # server ingress, bytes/s, shared by all uploads (0: unlimited)
    daily_amplitude: float = 0.0  # bandwidth dips by this fraction at peak_hour (0: off)
    peak_hour: float = 14.0  # hour of the virtual day with the least bandwidth
    # outer gradients sent as fp32 | bf16 | fp16 | int8 | int4 | package.module:Codec (a
    # codec of your own: fedlm/sim/codecs.py)
    compression: str = "fp32"
    # uploads of workers whose whole-model exchange outlasts their H steps of compute
    # (fedlm/sim/link_codecs.py): another encoding there; "": compression for all
    slow_compression: str = ""
    block_size: int = 256  # int8/int4: values per scale (0: one scale per tensor)
    error_feedback: bool = True  # int8/int4: the worker carries its rounding error forward
    # Hierarchical: the workers of a region train as one data-parallel pod (gradients
    # all-reduced every inner step over the local link) and only the pod talks to the
    # server over the WAN. The strategy then sees one worker per region.
    hierarchical: bool = False
    intra_bw: float = 12.5e9  # bytes/s of the link inside a region (100 Gbit/s)
    # How outer gradients are exchanged (fedlm.sim.collectives): star (a parameter
    # server: upload, then download the new model), ring or tree (an all-reduce among
    # the workers, no server; synchronous strategies only), hierarchical (= star
    # between region pods, as hierarchical = true).
    topology: str = "star"


@dataclass(frozen=True)
class SimConfig:
    """How many jobs run at once on one machine: Flower simulation engine (Ray)
    resources, and the in-process backend's job threads."""

    ray_actors: int = 0  # Ray actors running ClientApps; 0 = min(workers, CPU cores)
    # In-process backend: jobs run at once on each device, each in a thread with its own
    # model copy (and CUDA stream on a GPU: docs/gpu.md); 1 = one after another. Results
    # and the virtual clock do not depend on it.
    job_threads: int = 1
    # Devices of `device`'s kind the jobs spread over (fedlm.worker.placement, docs/gpu.md):
    # 0 = all this host sees (CUDA: every GPU; CPU: one), N = the first N. In process
    # worker w's jobs run on device w mod N, the server on the first; under Flower, Ray
    # shares the N GPUs among the actors (with sim.ray_address: the cluster's GPUs).
    # Results do not depend on it.
    devices: int = 0
    # An existing Ray cluster for the ClientApp actors ("host:port" of its head, or
    # "auto"); "" = Flower starts its own Ray on this host (docs/scaling.md).
    ray_address: str = ""
    # In-process backend: train the jobs in flight together as one computation over stacked
    # replicas (docs/gpu.md, "Batched workers"): on | off (one job at a time, the reference
    # bits) | auto (on where measured faster: fedlm.worker.batching.resolve). Equal to off
    # within rounding (not to the bit); a batched run replays and resumes bit for bit.
    batched: str = "off"
    cpus: int = 0  # CPUs given to Ray; 0 = all cores
    ttl: float = 3600.0  # Flower message time-to-live, seconds (counts queueing too)
    reply_timeout: float = 900.0  # give up on a job whose reply has not come in this long


@dataclass(frozen=True)
class FaultsConfig:
    """Injected faults, seeded: each job draws at most one kind, with these
    probabilities; after each job the worker may go offline for a while."""

    seed: int = -1  # -1: the run's seed
    crash: float = 0.0  # the ClientApp raises before training
    hang: float = 0.0  # the worker never replies (on the wall clock it stalls hang_seconds)
    nan: float = 0.0  # the update holds NaN/Inf
    bad_shape: float = 0.0  # one tensor of the update has the wrong shape
    bad_dtype: float = 0.0  # one tensor of the update is float64
    bad_size: float = 0.0  # one tensor of the update is missing
    duplicate: float = 0.0  # the reply is delivered twice
    offline: float = 0.0  # after a job, the worker goes offline for offline_seconds
    offline_seconds: float = 60.0  # length of an offline period (virtual or wall seconds)
    hang_seconds: float = 30.0  # wall clock: how long a hung ClientApp stalls before it dies
    workers: list[int] = field(default_factory=list)  # faults only on these workers (empty: all)


@dataclass(frozen=True)
class ReliabilityConfig:
    """Deadlines, failure limits and checkpoints."""

    deadline: float = 0.0  # seconds a job may take (virtual or wall); 0: auto
    deadline_factor: float = 3.0  # auto (virtual clock): factor x the job's nominal time
    max_failures: int = 3  # a worker failing this many jobs in a row is retired
    checkpoint_every: int = 10  # write a checkpoint every K global versions (0: off)
    checkpoint_keep: int = 3  # checkpoints kept per run (older ones are deleted)
    keep_weights: bool = True  # keep a finished run's final weights (for init.from = RUN_ID)
    hook_timeout: float = 600.0  # wall-clock s a call into the strategy may take (0: no bound)


@dataclass(frozen=True)
class StreamConfig:
    """Streaming DiLoCo's rounds (``fedlm.strategies.fragments``; the streamed server,
    ``fedlm.servers.streamed``, ``server = "streamed"``): for a synchronous strategy. The
    defaults are whole-model rounds; ``outer.fragments/overlap/mix`` is the old spelling."""

    fragments: int = 0  # P: exchange the model one fragment at a time (0: whole model)
    overlap: int = 0  # τ: inner steps an exchange overlaps before its fragment is mixed in
    mix: float | str = "auto"  # α, in (0, 1]; auto: 0.5 with overlap, 1 without


@dataclass(frozen=True)
class TrackConfig:
    """Experiment trackers that also get the run's metrics, as they are written
    (``fedlm.track``; ``pip install 'fedlm[track]'``). Off by default."""

    backends: list[str] = field(default_factory=list)  # of TRACKERS; `--track NAME` adds one
    dir: str = "runs/track"  # local files: TensorBoard events, MLflow's store, W&B offline runs
    project: str = "fedlm"  # the W&B project and the MLflow experiment
    group: str = ""  # runs shown together (fedlm sweep: the arm); "" = none
    mlflow_uri: str = ""  # an MLflow tracking URI; "" = SQLite file mlflow.db under dir
    wandb_mode: str = "offline"  # one of WANDB_MODES


@dataclass(frozen=True)
class Config:
    """A whole run. Top-level keys pick the building blocks; sections tune them."""

    name: str = ""  # free-form run label shown by `fedlm runs` and the dashboard
    seed: int = 0  # seeds model init, data order, jitter: same seed, same weights
    workers: int = 4  # number of workers (Flower SuperNodes)
    model: str = "small"  # tiny | small | 20m | 60m | 150m
    strategy: str = "diloco"  # aggregation strategy (see `strategies/`)
    local_steps: str = "fixed"  # local-steps policy: how many inner steps a job gets
    # The kind of server and its own settings ([server]; ``server = "regions"`` names a
    # kind alone): fedlm.config.server.
    server: ServerConfig = field(default_factory=ServerConfig)
    updates: int = 10  # outer updates of the global model to apply, then stop
    local_step_budget: int = 0  # also stop once workers have run this many inner steps (0: off)
    time_budget: float = 0.0  # also stop at this virtual time, seconds (0: off)
    max_in_flight: int = 0  # most jobs in flight at once (sampled among free workers); 0 = all
    # Async: which finished jobs are applied together before their workers get new work
    # (fedlm/engine/grace.py): auto (the adaptive window for strategies that ask for it:
    # delayed-nesterov; none for the others) | adaptive (for any async strategy) | off |
    # a number of seconds (a fixed window: jobs finishing that close to the first).
    grace: str = "auto"
    # Adaptive window: wait for the jobs expected with the first finished one for at most
    # this fraction of its job's time (0.5 at 20 s jobs: 10 s; jitter spreads them ~2-5 s).
    grace_span: float = 0.5
    clock: str = "virtual"  # virtual: apply in simulated-completion order; wall: real arrival order
    device: str = "auto"  # one of DEVICES
    db: str = "runs/fedlm.db"  # run store (SQLite); `--db` overrides
    outer: dict[str, Any] = field(default_factory=dict)  # strategy keyword arguments
    init: InitConfig = field(default_factory=InitConfig)
    inner: InnerConfig = field(default_factory=InnerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    reliability: ReliabilityConfig = field(default_factory=ReliabilityConfig)
    track: TrackConfig = field(default_factory=TrackConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)

    # -- serialisation -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        raw["init"] = {SPELLING.get(k, k): v for k, v in raw["init"].items()}
        raw["server"] = self.server.to_dict()
        return raw

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def decay_steps(self) -> int:
        """Cosine horizon of the inner schedule, in a worker's inner steps.

        Auto: the budget's share per worker when a local-step budget is set,
        else updates x H (exact for a synchronous run)."""
        if self.inner.decay_steps:
            return self.inner.decay_steps
        if self.local_step_budget:
            return max(1, self.local_step_budget // self.workers)
        return self.updates * self.inner.steps

    def shard_count(self) -> int:
        """Data shards the training data is split into (``data.shards``, 0: one per worker)."""
        return self.data.shards or self.workers

    def total_steps(self, nodes: int) -> int:
        """The run's inner steps over all workers: the local-step budget, else what
        ``updates`` synchronous rounds of H steps on every one of ``nodes`` take
        (``fedlm.sim.fleet.node_count``: the workers, or the region pods if hierarchical)."""
        return self.local_step_budget or self.updates * self.inner.steps * nodes

    def schedule_horizon(self, nodes: int) -> int:
        """Cosine horizon of ``inner.schedule`` in its own steps: a worker's share
        of the run (``decay_steps()``), a shard's share, or the whole run
        (``nodes`` as for ``total_steps``)."""
        kind = self.inner.schedule
        if kind == "worker":
            return self.decay_steps()
        if self.inner.decay_steps:
            return self.inner.decay_steps
        share = self.shard_count() if kind == "shard" else 1
        return max(1, self.total_steps(nodes) // share)

    def state_store(self) -> str:
        """Where workers keep their AdamW states: context or disk (``auto`` resolved)."""
        if self.inner.state_store != "auto":
            return self.inner.state_store
        return "disk" if self.reliability.checkpoint_every > 0 else "context"


# The [section] tables of a Config and the dataclass each one fills.
SECTIONS: dict[str, type] = {
    "init": InitConfig, "inner": InnerConfig, "data": DataConfig, "eval": EvalConfig,
    "fleet": FleetConfig, "sim": SimConfig, "faults": FaultsConfig,
    "reliability": ReliabilityConfig, "network": NetworkConfig, "track": TrackConfig,
    "stream": StreamConfig}

# Keys that moved to another section: the old place still reads, as the new one (so a
# plug-in strategy cannot take a setting of these names: config_load refuses it).
MOVED = {f"outer.{k}": f"stream.{k}" for k in ("fragments", "overlap", "mix")}

# Keys spelt differently in TOML than in Python (``from`` is a Python keyword).
SPELLING = {"from_": "from"}
