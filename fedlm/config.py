"""Typed, validated run configuration.

A run is described by one TOML file (or the embedded default) plus ``--set
key=value`` overrides. Everything is checked here, at the boundary: an unknown
key, a value of the wrong type or out of range is refused with a
``ConfigError`` whose one-line message names the field and the value. Code
past this module may trust the config.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from fedlm.errors import ConfigError  # noqa: F401  (re-exported: the error of a bad config)


# How outer gradients may travel (fedlm.compression).
COMPRESSIONS = ("fp32", "bf16", "fp16", "int8", "int4")

# Inner learning-rate schedules (InnerConfig.schedule) and shard choices (DataConfig).
SCHEDULES = ("worker", "shard", "global")
SHARD_CHOICES = ("fixed", "paper")

# Per-job fault kinds of the [faults] section (at most one per job), in draw order.
FAULT_KINDS = ("crash", "hang", "nan", "bad_shape", "bad_dtype", "bad_size", "duplicate")


@dataclass(frozen=True)
class InnerConfig:
    """The worker's job: H local AdamW steps on its own shard."""

    steps: int = 30  # H, local (inner) steps per job
    batch_size: int = 8  # sequences per inner step
    lr: float = 3e-3  # peak AdamW learning rate
    warmup_steps: int = 20  # linear warmup, counted in the schedule's own steps
    decay_steps: int = 0  # cosine horizon in the schedule's steps; 0 = auto (see Config)
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    # Whose progress the warmup + cosine follows (docs/strategies.md, "Inner schedules"):
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


@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from and how it is split across workers."""

    source: str = "shakespeare"  # "shakespeare" | "hf:NAME" | "text:GLOB"
    hf_config: str = ""  # dataset config name for hf: sources (e.g. "en" for allenai/c4)
    hf_split: str = "train"  # split to stream for hf: sources
    max_documents: int = 2000  # documents taken from an hf: stream
    text_column: str = "text"  # column holding the text in hf: sources
    partition: str = "by-play"  # "iid" | "by-play" | "dirichlet"
    shards: int = 0  # data shards the training data is split into; 0 = one per worker
    # Which shard a job trains: fixed (worker w always shard w) | paper (a free worker
    # draws an under-sampled shard, fedlm.shards; the delayed-Nesterov paper's rule).
    shard_choice: str = "fixed"
    alpha: float = 0.5  # Dirichlet concentration over genres (smaller = more skewed)
    seq_len: int = 128  # tokens per training sequence (context length)
    val_fraction: float = 0.05  # tail of every document held out for validation


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


@dataclass(frozen=True)
class FleetConfig:
    """Hardware and network profile of the simulated workers."""

    preset: str = "moderate"  # homogeneous | slight | moderate | very | paper-toy | geo
    base_step_time: float = 1.0  # virtual seconds per inner step of a speed-1 worker
    jitter: float = 0.05  # sigma of the lognormal multiplier on each job's compute time
    step_times: list[float] = field(default_factory=list)  # explicit s/step per worker
    regions: list[str] = field(default_factory=list)  # explicit region per worker
    # Geo topology: workers per region, in order, e.g. {us = 4, eu = 2, asia = 2}
    # (must add up to `workers`; overrides the preset's and `regions`' placement).
    topology: dict[str, Any] = field(default_factory=dict)
    # Extra regions: name -> {latency = s, down_bw = bytes/s, up_bw = bytes/s}.
    links: dict[str, Any] = field(default_factory=dict)
    # Wall clock only: a worker pads each job's compute so that it really takes
    # step_time / (fastest step_time) times as long as on the fastest worker.
    emulate_speed: bool = False


@dataclass(frozen=True)
class NetworkConfig:
    """The server's shared links, a daily bandwidth cycle, and what uploads are encoded as."""

    server_down: float = 0.0  # server egress, bytes/s, shared by all downloads (0: unlimited)
    server_up: float = 0.0  # server ingress, bytes/s, shared by all uploads (0: unlimited)
    daily_amplitude: float = 0.0  # bandwidth dips by this fraction at peak_hour (0: off)
    peak_hour: float = 14.0  # hour of the virtual day with the least bandwidth
    compression: str = "fp32"  # outer gradients sent as fp32 | bf16 | fp16 | int8 | int4
    block_size: int = 256  # int8/int4: values per scale (0: one scale per tensor)
    error_feedback: bool = True  # int8/int4: the worker carries its rounding error forward
    # Hierarchical: the workers of a region train as one data-parallel pod (gradients
    # all-reduced every inner step over the local link) and only the pod talks to the
    # server over the WAN. The strategy then sees one worker per region.
    hierarchical: bool = False
    intra_bw: float = 12.5e9  # bytes/s of the link inside a region (100 Gbit/s)


@dataclass(frozen=True)
class SimConfig:
    """Flower simulation engine (Ray) resources."""

    actors: int = 0  # Ray actors running ClientApps; 0 = min(workers, CPU cores)
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


@dataclass(frozen=True)
class Config:
    """A whole run. Top-level keys pick the building blocks; sections tune them."""

    name: str = ""  # free-form run label shown by `fedlm runs` and the dashboard
    seed: int = 0  # seeds model init, data order, jitter: same seed, same weights
    workers: int = 4  # number of workers (Flower SuperNodes)
    model: str = "small"  # tiny | small | 20m | 60m | 150m
    strategy: str = "diloco"  # aggregation strategy (see `strategies/`)
    local_steps: str = "fixed"  # local-steps policy: how many inner steps a job gets
    updates: int = 10  # outer updates of the global model to apply, then stop
    local_step_budget: int = 0  # also stop once workers have run this many inner steps (0: off)
    time_budget: float = 0.0  # also stop at this virtual time, seconds (0: off)
    concurrency: int = 0  # most jobs in flight at once (sampled among free workers); 0 = all
    grace: float = 0.0  # async grace period, virtual s: jobs finishing this close are applied together
    clock: str = "virtual"  # virtual: apply in simulated-completion order; wall: real arrival order
    device: str = "auto"  # auto | cpu | cuda
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

    # -- serialisation -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        raw["init"] = {_SPELLING.get(k, k): v for k, v in raw["init"].items()}
        return raw

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Config":
        return from_dict(json.loads(text))

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

    def total_steps(self) -> int:
        """The run's inner steps over all workers: the local-step budget, else what
        ``updates`` synchronous rounds of H steps on every node take."""
        return self.local_step_budget or self.updates * self.inner.steps * self.nodes()

    def schedule_horizon(self) -> int:
        """Cosine horizon of ``inner.schedule`` in its own steps: a worker's share
        of the run (``decay_steps()``), a shard's share, or the whole run."""
        kind = self.inner.schedule
        if kind == "worker":
            return self.decay_steps()
        if self.inner.decay_steps:
            return self.inner.decay_steps
        share = self.shard_count() if kind == "shard" else 1
        return max(1, self.total_steps() // share)

    def nodes(self) -> int:
        """Workers as the engine and Flower see them: one per region if hierarchical."""
        if not self.network.hierarchical:
            return self.workers
        from fedlm import fleet

        return len(fleet.groups(self))

    def state_store(self) -> str:
        """Where workers keep their AdamW states: context or disk (``auto`` resolved)."""
        if self.inner.state_store != "auto":
            return self.inner.state_store
        return "disk" if self.reliability.checkpoint_every > 0 else "context"


# ---------------------------------------------------------------------------
# Building and validating
# ---------------------------------------------------------------------------

_SECTIONS = {"init": InitConfig, "inner": InnerConfig, "data": DataConfig, "eval": EvalConfig,
             "fleet": FleetConfig, "sim": SimConfig, "faults": FaultsConfig,
             "reliability": ReliabilityConfig, "network": NetworkConfig}


def _coerce(path: str, value: Any, typ: Any) -> Any:
    """Check ``value`` against the annotated type; ints are accepted for floats."""
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return _int64(path, value)
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _finite(path, value)
    elif typ is str:
        if isinstance(value, str):
            if "\x00" in value:
                raise ConfigError(f"{path}: must not contain NUL characters, got {_repr(value)}")
            return value
    elif typ == list[float]:
        if isinstance(value, list) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            return [_finite(f"{path}[{k}]", v) for k, v in enumerate(value)]
    elif typ == list[int]:
        if isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            return [_int64(f"{path}[{k}]", v) for k, v in enumerate(value)]
    elif typ == list[str]:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [_coerce(f"{path}[{k}]", v, str) for k, v in enumerate(value)]
    elif typ == dict[str, Any]:
        if isinstance(value, dict):
            return dict(value)
    name = _TYPE_NAMES.get(typ) or getattr(typ, "__name__", str(typ))
    raise ConfigError(f"{path}: expected {name}, got {_repr(value)}")


_TYPE_NAMES = {list[float]: "a list of numbers", list[int]: "a list of integers",
               list[str]: "a list of strings", dict[str, Any]: "a table"}


def _int64(path: str, value: int) -> int:
    """Ints must fit the run store (SQLite INTEGER) and torch seeds: 64 bits, signed."""
    if not -(2**63) <= value < 2**63:
        raise ConfigError(f"{path}: must be an integer in [-2**63, 2**63), got {_repr(value)}")
    return value


def _finite(path: str, value: int | float) -> float:
    """NaN and infinities are refused for every float setting (0 means "off" where
    a setting can be off)."""
    try:
        result = float(value)
    except OverflowError:  # an int past float range
        result = math.inf
    if not math.isfinite(result):
        raise ConfigError(f"{path}: must be a finite number, got {_repr(value)}")
    return result


def _repr(value: Any, limit: int = 200) -> str:
    """repr() for messages: never raises (ints past 4300 digits do), never long."""
    try:
        text = repr(value)
    except ValueError:
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) \
            else f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _show(name: str) -> str:
    """A key or path for a message: quoted when empty or holding unprintable characters."""
    return name if name and name.isprintable() else repr(name)


# Keys spelt differently in TOML than in Python (``from`` is a Python keyword).
_SPELLING = {"from_": "from"}
_ATTRIBUTE = {v: k for k, v in _SPELLING.items()}
# Text keys that may hold a bare number (``--set init.from=7`` parses 7 as an int).
_NUMBER_AS_TEXT = {"from_"}


def _build(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    hints = get_type_hints(cls)
    known = {_SPELLING.get(f.name, f.name) for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a table, got {_repr(raw)}")
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if key not in known:
            raise ConfigError(f"{_show(path)}: unknown key (known: {', '.join(sorted(known))})")
        key = _ATTRIBUTE.get(key, key)
        typ = hints[key]
        if key in _NUMBER_AS_TEXT and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if key in _SECTIONS and cls is Config:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: expected a [{key}] section, got {_repr(value)}")
            kwargs[key] = _build(_SECTIONS[key], value, f"{path}.")
        else:
            kwargs[key] = _coerce(path, value, typ)
    return cls(**kwargs)


def from_dict(raw: dict[str, Any]) -> Config:
    """Build a ``Config`` from plain data and validate it."""
    cfg = _build(Config, raw, "")
    validate(cfg)
    return cfg


def _require(ok: bool, path: str, value: Any, why: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {why}, got {_repr(value)}")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__


def _check_outer_types(cls: type, outer: dict[str, Any]) -> None:
    """``outer.*`` values against the strategy constructor's annotations (scalars only),
    so that a wrong type is refused naming its key rather than by a TypeError inside
    the constructor, and NaN/inf/huge ints the same way as everywhere else."""
    try:
        hints = get_type_hints(cls.__init__)
    except Exception:  # a plugin whose annotations do not resolve: the constructor checks
        return
    for key, value in outer.items():
        if not key.isprintable():
            raise ConfigError(f"outer.{_show(key)}: not a setting of {cls.__name__}")
        if hints.get(key) in (bool, int, float, str):
            _coerce(f"outer.{_show(key)}", value, hints[key])


def validate(cfg: Config) -> None:
    """Range and name checks that need more than a type."""
    from fedlm import fleet, model  # late: keeps config importable on its own
    from strategies import registry

    _require(cfg.workers >= 1, "workers", cfg.workers, "must be >= 1")
    _require(cfg.updates >= 1, "updates", cfg.updates, "must be >= 1")
    _require(cfg.db.strip() != "", "db", cfg.db, "must be a path (the run database)")
    _require(cfg.model in model.PRESETS, "model", cfg.model,
             f"unknown preset (known: {', '.join(model.PRESETS)})")
    _require(cfg.device in ("auto", "cpu", "cuda"), "device", cfg.device,
             "must be auto, cpu or cuda")
    _require(cfg.local_step_budget >= 0, "local_step_budget", cfg.local_step_budget,
             "must be >= 0")
    _require(cfg.time_budget >= 0, "time_budget", cfg.time_budget, "must be >= 0")
    _require(cfg.concurrency >= 0, "concurrency", cfg.concurrency, "must be >= 0")
    _require(cfg.grace >= 0, "grace", cfg.grace, "must be >= 0")
    _require(cfg.clock in ("virtual", "wall"), "clock", cfg.clock, "must be virtual or wall")
    try:
        _check_outer_types(registry.strategy_class(cfg.strategy), cfg.outer)
        registry.check_strategy(cfg.strategy, cfg.outer)
    except ConfigError:
        raise
    except Exception as exc:  # a dotted path that is no module (":x", ".:x"), a broken plugin
        raise ConfigError(f"strategy: cannot load {_repr(cfg.strategy)} "
                          f"({type(exc).__name__}: {_first_line(exc)})") from None
    registry.check_local_steps(cfg.local_steps)

    i = cfg.inner
    _require(i.steps >= 1, "inner.steps", i.steps, "must be >= 1")
    _require(i.batch_size >= 1, "inner.batch_size", i.batch_size, "must be >= 1")
    _require(i.lr > 0, "inner.lr", i.lr, "must be > 0")
    _require(i.warmup_steps >= 0, "inner.warmup_steps", i.warmup_steps, "must be >= 0")
    _require(i.decay_steps >= 0, "inner.decay_steps", i.decay_steps, "must be >= 0")
    _require(0 <= i.min_lr_ratio <= 1, "inner.min_lr_ratio", i.min_lr_ratio, "must be in [0, 1]")
    _require(i.weight_decay >= 0, "inner.weight_decay", i.weight_decay, "must be >= 0")
    _require(0 <= i.beta1 < 1, "inner.beta1", i.beta1, "must be in [0, 1)")
    _require(0 <= i.beta2 < 1, "inner.beta2", i.beta2, "must be in [0, 1)")
    _require(i.grad_clip >= 0, "inner.grad_clip", i.grad_clip, "must be >= 0")
    _require(i.threads >= 1, "inner.threads", i.threads, "must be >= 1")
    _require(i.state_store in ("auto", "context", "disk"), "inner.state_store", i.state_store,
             "must be auto, context or disk")
    _require(i.schedule in SCHEDULES, "inner.schedule", i.schedule,
             f"must be one of {', '.join(SCHEDULES)}")

    _require(cfg.init.pretrain_steps >= 0, "init.pretrain_steps", cfg.init.pretrain_steps,
             "must be >= 0")

    d = cfg.data
    _require(d.source == "shakespeare" or (d.source.startswith(("hf:", "text:"))
                                           and d.source.split(":", 1)[1].strip() != ""),
             "data.source", d.source, "must be shakespeare, hf:NAME or text:GLOB")
    _require(d.partition in ("iid", "by-play", "dirichlet"), "data.partition",
             d.partition, "must be iid, by-play or dirichlet")
    _require(d.alpha > 0, "data.alpha", d.alpha, "must be > 0")
    _require(d.shards >= 0, "data.shards", d.shards, "must be >= 0 (0: one per worker)")
    _require(d.shard_choice in SHARD_CHOICES, "data.shard_choice", d.shard_choice,
             f"must be one of {', '.join(SHARD_CHOICES)}")
    _require(d.shard_choice != "fixed" or d.shards in (0, cfg.workers), "data.shards", d.shards,
             f"must be 0 or the number of workers ({cfg.workers}) with data.shard_choice = "
             f"'fixed' (one shard per worker); use data.shard_choice = 'paper' for more")
    _require(d.seq_len >= 8, "data.seq_len", d.seq_len, "must be >= 8")
    _require(0 < d.val_fraction < 0.5, "data.val_fraction", d.val_fraction, "must be in (0, 0.5)")
    _require(d.max_documents >= 1, "data.max_documents", d.max_documents, "must be >= 1")
    if d.source == "shakespeare" and d.partition == "by-play":
        # other sources are counted once loaded, still before a run is stored (cli)
        from fedlm.data import shakespeare_play_count

        plays = shakespeare_play_count()
        key, count = ("data.shards", d.shards) if d.shards else ("workers", cfg.workers)
        _require(count <= plays, key, count,
                 f"must be at most {plays} with data.partition = 'by-play' (the corpus has "
                 f"{plays} plays; use fewer {key.split('.')[-1]} or data.partition = 'iid')")

    e = cfg.eval
    _require(e.every >= 1, "eval.every", e.every, "must be >= 1")
    _require(e.batches >= 1, "eval.batches", e.batches, "must be >= 1")
    _require(e.batch_size >= 1, "eval.batch_size", e.batch_size, "must be >= 1")

    f = cfg.fleet
    _require(f.preset in fleet.PRESETS, "fleet.preset", f.preset,
             f"unknown preset (known: {', '.join(fleet.PRESETS)})")
    _require(f.base_step_time > 0, "fleet.base_step_time", f.base_step_time, "must be > 0")
    _require(f.jitter >= 0, "fleet.jitter", f.jitter, "must be >= 0")
    for k, t in enumerate(f.step_times):
        _require(t > 0, f"fleet.step_times[{k}]", t, "must be > 0")
    for name, link in f.links.items():
        ok = (isinstance(link, dict) and set(link) == {"latency", "down_bw", "up_bw"}
              and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                      and 0 <= v < float("inf") for v in link.values())
              and link["down_bw"] > 0 and link["up_bw"] > 0)
        _require(ok, f"fleet.links.{name}", link,
                 "must be a table {latency = s, down_bw = bytes/s, up_bw = bytes/s}, "
                 "bandwidths > 0")
    known = [*fleet.REGIONS, *f.links]
    for k, r in enumerate(f.regions):
        _require(r in known, f"fleet.regions[{k}]", r,
                 f"unknown region (known: {', '.join(known)})")
    for name, count in f.topology.items():
        _require(name in known, f"fleet.topology.{name}", name,
                 f"unknown region (known: {', '.join(known)})")
        _require(isinstance(count, int) and not isinstance(count, bool) and count >= 1,
                 f"fleet.topology.{name}", count, "must be a number of workers >= 1")
    if f.topology:
        total = sum(f.topology.values())
        _require(total == cfg.workers, "fleet.topology", f.topology,
                 f"places {total} workers, but workers = {cfg.workers}")

    n = cfg.network
    _require(n.server_down >= 0, "network.server_down", n.server_down, "must be >= 0")
    _require(n.server_up >= 0, "network.server_up", n.server_up, "must be >= 0")
    _require(0 <= n.daily_amplitude < 1, "network.daily_amplitude", n.daily_amplitude,
             "must be in [0, 1)")
    _require(0 <= n.peak_hour < 24, "network.peak_hour", n.peak_hour, "must be in [0, 24)")
    _require(n.compression in COMPRESSIONS, "network.compression", n.compression,
             f"must be one of {', '.join(COMPRESSIONS)}")
    _require(n.block_size >= 0, "network.block_size", n.block_size, "must be >= 0")
    _require(n.intra_bw > 0, "network.intra_bw", n.intra_bw, "must be > 0")

    fa = cfg.faults
    for name in ("crash", "hang", "nan", "bad_shape", "bad_dtype", "bad_size", "duplicate",
                 "offline"):
        p = getattr(fa, name)
        _require(0 <= p <= 1, f"faults.{name}", p, "must be a probability in [0, 1]")
    total = sum(getattr(fa, n) for n in FAULT_KINDS)
    _require(total <= 1, "faults", total, "per-job fault probabilities must sum to <= 1")
    _require(0 < fa.offline_seconds < float("inf"), "faults.offline_seconds",
             fa.offline_seconds, "must be > 0 and finite")
    _require(0 <= fa.hang_seconds < float("inf"), "faults.hang_seconds", fa.hang_seconds,
             "must be >= 0 and finite")
    for k, w in enumerate(fa.workers):
        _require(0 <= w < cfg.workers, f"faults.workers[{k}]", w, "must be a worker index")

    r = cfg.reliability
    _require(r.deadline >= 0, "reliability.deadline", r.deadline, "must be >= 0")
    _require(r.deadline_factor >= 1, "reliability.deadline_factor", r.deadline_factor,
             "must be >= 1")
    _require(r.max_failures >= 1, "reliability.max_failures", r.max_failures, "must be >= 1")
    _require(r.checkpoint_every >= 0, "reliability.checkpoint_every", r.checkpoint_every,
             "must be >= 0")
    _require(r.checkpoint_keep >= 2, "reliability.checkpoint_keep", r.checkpoint_keep,
             "must be >= 2 (a corrupt newest one falls back to the one before)")

    s = cfg.sim
    _require(s.actors >= 0, "sim.actors", s.actors, "must be >= 0")
    _require(s.cpus >= 0, "sim.cpus", s.cpus, "must be >= 0")
    _require(s.ttl > 0, "sim.ttl", s.ttl, "must be > 0")
    _require(s.reply_timeout > 0, "sim.reply_timeout", s.reply_timeout, "must be > 0")


# ---------------------------------------------------------------------------
# Files and --set overrides
# ---------------------------------------------------------------------------

# Short names a user may type instead of the full dotted key.
ALIASES = {"profile": "fleet.preset", "H": "inner.steps", "partition": "data.partition"}


def parse_value(text: str) -> Any:
    """Parse the right-hand side of ``--set key=value`` as a TOML value.

    ``--set inner.lr=1e-3`` gives a float, ``--set strategy=fedavg`` a string
    (bare words that are not TOML are taken as strings).
    """
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (ValueError, RecursionError):  # not TOML; nested too deep; an int past 4300 digits
        return text


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``key=value`` (dotted key) to the raw config dict in place."""
    if "=" not in assignment:
        raise ConfigError(f"--set {_show(assignment)}: expected key=value")
    key, text = assignment.split("=", 1)
    key = ALIASES.get(key.strip(), key.strip())
    if not key:
        raise ConfigError(f"--set {_show(assignment)}: empty key")
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{_show(key)}: {_show(part)} is not a section")
        node = child
    node[parts[-1]] = parse_value(text.strip())


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a TOML config (or the defaults), apply ``--set`` overrides, validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config: {_show(str(p))} is a directory, not a TOML file")
        if not p.is_file():
            raise ConfigError(f"config: no such file {str(p)!r}")
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"config: cannot read {_show(str(p))}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config: {_show(str(p))}: not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})") from None
        except RecursionError:
            raise ConfigError(f"config: {_show(str(p))}: nested too deeply") from None
        except ValueError as exc:  # TOMLDecodeError; an int past 4300 digits
            raise ConfigError(f"config: {_show(str(p))}: {_first_line(exc)}") from None
    for assignment in overrides:
        apply_override(raw, assignment)
    return from_dict(raw)
