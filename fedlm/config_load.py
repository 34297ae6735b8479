"""Build a validated ``Config`` from a TOML file, ``--set`` overrides or stored JSON.

A run is described by one TOML file (or the embedded default) plus ``--set
key=value`` overrides. Everything is checked here, at the boundary: an unknown
key, a value of the wrong type or out of range is refused with a
``ConfigError`` whose one-line message names the field and the value. Names are
checked against what they name: the model presets (``fedlm.presets``), the fleet
presets and regions (``fedlm.sim.fleet``), the strategy registry; none of these
imports torch, so loading a config does not either.

    load(path, overrides)   a TOML file (or the defaults) + ``--set key=value``
    from_dict(raw)          plain data, e.g. parsed TOML
    from_json(text)         ``Config.to_json()`` output, e.g. a stored run's config

The schema itself (sections, keys, defaults) is ``fedlm.config``.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

from fedlm.sim import fleet
from fedlm import presets
from fedlm.config import (CLOCKS, COMPRESSIONS, DEVICES, FAULT_KINDS, GRACE_RULES, PARTITIONS,
                          PRECISIONS, SCHEDULES, SECTIONS, SHARD_CHOICES, SPELLING, STATE_STORES,
                          Config)
from fedlm.data import shakespeare_play_count
from fedlm.errors import ConfigError
from fedlm.strategies import registry


# ---------------------------------------------------------------------------
# Building and validating
# ---------------------------------------------------------------------------

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
    """A key or path for a message: quoted when empty, blank at either end or holding
    unprintable characters (so a message never starts or ends with white space)."""
    plain = name and name.isprintable() and name == name.strip()
    return name if plain else repr(name)


# TOML spelling -> attribute name (``SPELLING`` the other way).
_ATTRIBUTE = {v: k for k, v in SPELLING.items()}
# Text keys that may hold a bare number (``--set init.from=7`` parses 7 as an int).
_NUMBER_AS_TEXT = {"from_", "grace"}


def _build(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    hints = get_type_hints(cls)
    known = {SPELLING.get(f.name, f.name) for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a table, got {_repr(raw)}")
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if key not in known:
            raise ConfigError(f"{_show(path)}: unknown key (known: {', '.join(sorted(known))})")
        key = _ATTRIBUTE.get(key, key)
        typ = hints[key]
        if key in _NUMBER_AS_TEXT and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            value = str(value)
        if key in SECTIONS and cls is Config:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: expected a [{key}] section, got {_repr(value)}")
            kwargs[key] = _build(SECTIONS[key], value, f"{path}.")
        else:
            kwargs[key] = _coerce(path, value, typ)
    return cls(**kwargs)


def from_dict(raw: dict[str, Any]) -> Config:
    """Build a ``Config`` from plain data and validate it."""
    cfg = _build(Config, raw, "")
    validate(cfg)
    return cfg


def from_json(text: str) -> Config:
    """The ``Config`` that ``Config.to_json()`` wrote (a stored run's), validated again."""
    return from_dict(json.loads(text))


def _seconds(text: str) -> float | None:
    """A number of seconds >= 0 written as text (``grace = "4"``), else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _require(ok: bool, path: str, value: Any, why: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {why}, got {_repr(value)}")


def _require_choice(path: str, value: Any, choices: tuple[str, ...]) -> None:
    """``value`` must be one of the schema's ``choices`` (fedlm.config's constants)."""
    _require(value in choices, path, value,
             f"must be {', '.join(choices[:-1])} or {choices[-1]}")


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
    _require(cfg.workers >= 1, "workers", cfg.workers, "must be >= 1")
    _require(cfg.updates >= 1, "updates", cfg.updates, "must be >= 1")
    _require(cfg.db.strip() != "", "db", cfg.db, "must be a path (the run database)")
    _require(cfg.model in presets.PRESETS, "model", cfg.model,
             f"unknown preset (known: {', '.join(presets.PRESETS)})")
    _require_choice("device", cfg.device, DEVICES)
    _require(cfg.local_step_budget >= 0, "local_step_budget", cfg.local_step_budget,
             "must be >= 0")
    _require(cfg.time_budget >= 0, "time_budget", cfg.time_budget, "must be >= 0")
    _require(cfg.concurrency >= 0, "concurrency", cfg.concurrency, "must be >= 0")
    _require(cfg.grace in GRACE_RULES or _seconds(cfg.grace) is not None, "grace", cfg.grace,
             f"must be {', '.join(GRACE_RULES)} or a number of seconds >= 0")
    _require(0 < cfg.grace_span <= 10, "grace_span", cfg.grace_span, "must be in (0, 10]")
    _require_choice("clock", cfg.clock, CLOCKS)
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
    _require_choice("inner.state_store", i.state_store, STATE_STORES)
    _require_choice("inner.schedule", i.schedule, SCHEDULES)
    _require_choice("inner.precision", i.precision, PRECISIONS)

    _require(cfg.init.pretrain_steps >= 0, "init.pretrain_steps", cfg.init.pretrain_steps,
             "must be >= 0")

    d = cfg.data
    _require(d.source == "shakespeare" or (d.source.startswith(("hf:", "text:"))
                                           and d.source.split(":", 1)[1].strip() != ""),
             "data.source", d.source, "must be shakespeare, hf:NAME or text:GLOB")
    _require_choice("data.partition", d.partition, PARTITIONS)
    _require(d.alpha > 0, "data.alpha", d.alpha, "must be > 0")
    _require(d.shards >= 0, "data.shards", d.shards, "must be >= 0 (0: one per worker)")
    _require_choice("data.shard_choice", d.shard_choice, SHARD_CHOICES)
    _require(d.shard_choice != "fixed" or d.shards in (0, cfg.workers), "data.shards", d.shards,
             f"must be 0 or the number of workers ({cfg.workers}) with data.shard_choice = "
             f"'fixed' (one shard per worker); use data.shard_choice = 'paper' for more")
    _require(d.seq_len >= 8, "data.seq_len", d.seq_len, "must be >= 8")
    _require(0 < d.val_fraction < 0.5, "data.val_fraction", d.val_fraction, "must be in (0, 0.5)")
    _require(d.max_documents >= 1, "data.max_documents", d.max_documents, "must be >= 1")
    if d.source == "shakespeare" and d.partition == "by-play":
        # other sources are counted once loaded, still before a run is stored (cli)
        plays = shakespeare_play_count()
        key, count = ("data.shards", d.shards) if d.shards else ("workers", cfg.workers)
        _require(count <= plays, key, count,
                 f"must be at most {plays} with data.partition = 'by-play' (the corpus has "
                 f"{plays} plays; use fewer {key.split('.')[-1]} or data.partition = 'iid')")

    e = cfg.eval
    _require(e.every >= 1, "eval.every", e.every, "must be >= 1")
    _require(e.batches >= 1, "eval.batches", e.batches, "must be >= 1")
    _require(e.batch_size >= 1, "eval.batch_size", e.batch_size, "must be >= 1")
    _require(e.diverge_factor == 0 or e.diverge_factor > 1, "eval.diverge_factor",
             e.diverge_factor, "must be 0 (only non-finite losses) or > 1")

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
    _require_choice("network.compression", n.compression, COMPRESSIONS)
    _require(n.block_size >= 0, "network.block_size", n.block_size, "must be >= 0")
    _require(n.intra_bw > 0, "network.intra_bw", n.intra_bw, "must be > 0")

    fa = cfg.faults
    for name in (*FAULT_KINDS, "offline"):
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
    _require(s.concurrent_jobs >= 1, "sim.concurrent_jobs", s.concurrent_jobs, "must be >= 1")
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


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """A TOML file as a dict; anything wrong with it is a one-line ``ConfigError``
    starting with ``what`` (a config, a sweep spec)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what}: {_show(str(p))} is a directory, not a TOML file")
    if not p.is_file():
        raise ConfigError(f"{what}: no such file {str(p)!r}")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {_show(str(p))}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what}: {_show(str(p))}: not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from None
    except RecursionError:
        raise ConfigError(f"{what}: {_show(str(p))}: nested too deeply") from None
    except ValueError as exc:  # TOMLDecodeError; an int past 4300 digits
        raise ConfigError(f"{what}: {_show(str(p))}: {_first_line(exc)}") from None


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a TOML config (or the defaults), apply ``--set`` overrides, validate."""
    raw: dict[str, Any] = {} if path is None else read_toml(path, "config")
    for assignment in overrides:
        apply_override(raw, assignment)
    return from_dict(raw)
