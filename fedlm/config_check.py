"""The checks of a config's values: each value against its annotated type
(``fedlm.config.values.coerce``, as ``fedlm.config_load`` builds a ``Config``), then the range and name
checks that need more than a type (``validate``). Each refusal is a one-line
``ConfigError`` naming the field and the value. Choices are spelled from the schema's constants (``fedlm.config``); names
are checked against what they name (the model presets, the fleet presets and
regions, the strategy registry, the kinds of server), none of which imports torch.
"""

from __future__ import annotations

import math
import re
from typing import Any, get_type_hints

from fedlm import presets
from fedlm.config import (BATCH_MODES, CLOCKS, DEVICES, GRACE_RULES, PARTITIONS,
                          PRECISIONS, SCHEDULES, SHARD_CHOICES, STATE_STORES, TOPOLOGIES,
                          TRACKERS, WANDB_MODES, Config)
from fedlm.config.values import coerce
from fedlm.data import shakespeare_play_count, tokenizer
from fedlm.errors import ConfigError, first_line, require, shown, shown_key
from fedlm.servers.checks import check_exchange
from fedlm.servers.watch import MIN_LIMIT
from fedlm.sim import codecs, faults, fleet, fleet_check, geo, link_codecs, quantities as Q
from fedlm.worker import optimizers
from fedlm.strategies import registry
from fedlm.strategies.traits import traits


MAX_GRACE = 86400.0  # a grace window of more than a day waits for every job: use sync


def _seconds(text: str) -> float | None:
    """A number of seconds in [0, MAX_GRACE] written as text (``grace = "4"``), else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value <= MAX_GRACE else None


_require = require  # the checks below read as before


def _require_choice(path: str, value: Any, choices: tuple[str, ...]) -> None:
    """``value`` must be one of the schema's ``choices`` (fedlm.config's constants)."""
    _require(value in choices, path, value,
             f"must be {', '.join(choices[:-1])} or {choices[-1]}")


def _setting_types(cls: type) -> dict[str, Any]:
    """The annotations of ``cls``'s settings, its parents' included where a constructor
    hands the rest on (``registry.constructors``: DiLoCo's sampling settings are FedAvg's)."""
    hints: dict[str, Any] = {}
    for init in registry.constructors(cls):
        try:
            hints = {**get_type_hints(init), **hints}  # a subclass's wins
        except Exception:  # a plugin whose annotations do not resolve: the constructor checks
            pass
    return hints


def check_outer_types(cls: type, outer: dict[str, Any], section: str = "outer") -> None:
    """``outer.*`` values (``section``: where they were given, as a region server's
    ``server.global_outer``) against the strategy constructor's annotations (scalars
    only), so that a wrong type is refused naming its key rather than by a TypeError
    inside the constructor, and NaN/inf/huge ints the same way as everywhere else."""
    hints = _setting_types(cls)
    for key, value in outer.items():
        path = f"{section}.{shown_key(key)}"
        if not key.isprintable():
            raise ConfigError(f"{path}: not a setting of {cls.__name__}")
        if value is None:  # TOML has no null: a config with one could not be written back
            raise ConfigError(f"{path}: must be given a value, got None")
        if hints.get(key) in (bool, int, float, str):
            coerce(path, value, hints[key])
        elif isinstance(value, float) and not math.isfinite(value):  # whatever its type says
            raise ConfigError(f"{path}: must be a finite number, got {value!r}")


def validate(cfg: Config) -> None:
    """Range and name checks beyond types, section by section (the first one fails)."""
    for check in (_check_run, _check_inner, _check_data, _check_eval, _check_fleet,
                  _check_strategy, _check_network, faults.check_config, _check_reliability,
                  _check_sim, _check_track):
        check(cfg)


def _check_run(cfg: Config) -> None:
    _require(cfg.workers >= 1, "workers", cfg.workers, "must be >= 1")
    _require(cfg.updates >= 1, "updates", cfg.updates, "must be >= 1")
    _require(cfg.db.strip() != "", "db", cfg.db, "must be a path (the run database)")
    _require(cfg.model in presets.PRESETS, "model", cfg.model,
             f"unknown preset (known: {', '.join(presets.PRESETS)})")
    _require_choice("device", cfg.device, DEVICES)
    _require(cfg.local_step_budget >= 0, "local_step_budget", cfg.local_step_budget,
             "must be >= 0")
    _require(cfg.time_budget >= 0, "time_budget", cfg.time_budget, "must be >= 0")
    _require(cfg.max_in_flight >= 0, "max_in_flight", cfg.max_in_flight, "must be >= 0")
    _require(cfg.grace in GRACE_RULES or _seconds(cfg.grace) is not None, "grace", cfg.grace,
             f"must be {', '.join(GRACE_RULES)} or a number of seconds in [0, "
             f"{MAX_GRACE:g}]")
    _require(0 < cfg.grace_span <= 10, "grace_span", cfg.grace_span, "must be in (0, 10]")
    _require_choice("clock", cfg.clock, CLOCKS)


def _check_strategy(cfg: Config) -> None:
    """The strategy (built-in or plug-in), its settings, the local-steps policy."""
    try:
        check_outer_types(registry.strategy_class(cfg.strategy), cfg.outer)
        trial = registry.check_strategy(cfg.strategy, cfg.outer)
    except ConfigError:
        raise
    except Exception as exc:  # a dotted path that is no module (":x", ".:x"), a broken plugin
        raise ConfigError(f"strategy: cannot load {shown(cfg.strategy)} "
                          f"({type(exc).__name__}: {first_line(exc)})") from None
    _tell_fleet(cfg, trial, _kind_cuts_rounds(cfg))
    registry.check_local_steps(cfg.local_steps)
    strategy_cls = registry.strategy_class(cfg.strategy)
    # a synchronous strategy's rounds on any kind that serves it (streamed rounds refuse
    # every policy but fixed: fedlm.servers.checks)
    _require(not registry.LOCAL_STEPS[cfg.local_steps].sizes_rounds
             or traits(strategy_cls).synchronous, "local_steps",
             cfg.local_steps, f"sizes synchronous rounds; {cfg.strategy!r} has none "
             f"(use dylu with an asynchronous strategy)")


def _kind_cuts_rounds(cfg: Config) -> bool:
    """Whether the config's kind of server closes rounds itself (``Serves.cuts_rounds``;
    a kind that does not load is reported by its own check)."""
    from fedlm import servers

    try:
        return servers.server_class(cfg).serves.cuts_rounds
    except Exception:  # noqa: BLE001 - check_exchange says what is wrong with the kind
        return False


def _tell_fleet(cfg: Config, trial, cut_by_server: bool) -> None:
    """The trial strategy told the run's fleet (``Strategy.on_fleet``), as its server
    tells it at start (and, first, that its kind cuts its rounds: ``cut_by_server``):
    settings that count workers (a quorum, a round's minimum) above the fleet's, or
    late replies where none can be late, are refused now, before a run is stored, not
    once it has started."""
    from fedlm.strategies.base import FleetFacts
    from fedlm.strategies.rounds import rounds_cut_by_server

    if cut_by_server:
        rounds_cut_by_server(trial)

    facts = FleetFacts(cfg.seed, tuple(p.step_time for p in fleet.node_profiles(cfg)),
                       cfg.inner.steps)
    try:
        trial.on_fleet(facts)
    except ValueError as exc:
        raise ConfigError(first_line(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a plug-in's own on_fleet that fails
        raise ConfigError(f"strategy: {shown(cfg.strategy)}'s on_fleet failed "
                          f"({type(exc).__name__}: {first_line(exc)})") from None


def _check_inner(cfg: Config) -> None:
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
    optimizers.check(i.optimizer)  # adamw, or a factory loaded by dotted path

    _require(cfg.init.pretrain_steps >= 0, "init.pretrain_steps", cfg.init.pretrain_steps,
             "must be >= 0")


def _check_data(cfg: Config) -> None:
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
    tokenizer.bpe_vocab(d.tokenizer)  # byte | bpe:V with V in range, else a one-line error
    if d.source == "shakespeare" and d.partition == "by-play":
        # other sources are counted once loaded, still before a run is stored (cli)
        plays = shakespeare_play_count()
        key, count = ("data.shards", d.shards) if d.shards else ("workers", cfg.workers)
        _require(count <= plays, key, count,
                 f"must be at most {plays} with data.partition = 'by-play' (the corpus has "
                 f"{plays} plays; use fewer {key.split('.')[-1]} or data.partition = 'iid')")


def _check_eval(cfg: Config) -> None:
    e = cfg.eval
    _require(e.every >= 1, "eval.every", e.every, "must be >= 1")
    _require(e.batches >= 1, "eval.batches", e.batches, "must be >= 1")
    _require(e.batch_size >= 1, "eval.batch_size", e.batch_size, "must be >= 1")
    _require(e.diverge_factor == 0 or e.diverge_factor > 1, "eval.diverge_factor",
             e.diverge_factor, "must be 0 (only non-finite losses) or > 1")


def _check_fleet(cfg: Config) -> None:
    """The workers' profiles and placement (``fleet_check``: traces, dynamics)."""
    f = cfg.fleet
    _require(f.preset in fleet.PRESETS, "fleet.preset", f.preset,
             f"unknown preset (known: {', '.join(fleet.PRESETS)})")
    Q.STEP.check("fleet.base_step_time", f.base_step_time)
    Q.JITTER.check("fleet.jitter", f.jitter)
    Q.check_all("fleet.step_times", f.step_times, Q.STEP)
    for name, link in f.links.items():
        _require(isinstance(link, dict) and set(link) == {"latency", "down_bw", "up_bw"},
                 f"fleet.links.{name}", link,
                 "must be a table {latency = s, down_bw = bytes/s, up_bw = bytes/s}")
        Q.LATENCY.check(f"fleet.links.{name}.latency", link["latency"])
        Q.BANDWIDTH.check(f"fleet.links.{name}.down_bw", link["down_bw"])
        Q.BANDWIDTH.check(f"fleet.links.{name}.up_bw", link["up_bw"])
    problem = geo.matrix_problem(f.matrix)
    if problem is not None:
        raise ConfigError(f"fleet.matrix: {problem}")
    known = list(fleet.regions_of(f))
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
    fleet_check.check(cfg)


def _check_network(cfg: Config) -> None:
    n = cfg.network
    for name in ("server_down", "server_up"):  # 0: no shared server link
        if getattr(n, name) != 0:
            Q.BANDWIDTH.check(f"network.{name}", getattr(n, name))
    _require(0 <= n.daily_amplitude < 1, "network.daily_amplitude", n.daily_amplitude,
             "must be in [0, 1)")
    _require(0 <= n.peak_hour < 24, "network.peak_hour", n.peak_hour, "must be in [0, 24)")
    codecs.check(n.compression)  # a built-in encoding, or a codec by dotted path
    link_codecs.check(cfg)  # another for the slow links, on a kind that can send it
    _require(n.block_size >= 0, "network.block_size", n.block_size, "must be >= 0")
    Q.BANDWIDTH.check("network.intra_bw", n.intra_bw)
    _require_choice("network.topology", n.topology, TOPOLOGIES)
    check_exchange(cfg)  # the server kind, topology and streaming rounds: the servers'


def _check_reliability(cfg: Config) -> None:
    r = cfg.reliability
    _require(r.deadline >= 0, "reliability.deadline", r.deadline, "must be >= 0")
    _require(r.deadline_factor >= 1, "reliability.deadline_factor", r.deadline_factor,
             "must be >= 1")
    _require(r.max_failures >= 1, "reliability.max_failures", r.max_failures, "must be >= 1")
    _require(r.checkpoint_every >= 0, "reliability.checkpoint_every", r.checkpoint_every,
             "must be >= 0")
    _require(r.checkpoint_keep >= 2, "reliability.checkpoint_keep", r.checkpoint_keep,
             "must be >= 2 (a corrupt newest one falls back to the one before)")
    _require(r.hook_timeout == 0 or r.hook_timeout >= MIN_LIMIT,
             "reliability.hook_timeout", r.hook_timeout,
             f"must be 0 (no bound) or at least {MIN_LIMIT:g} s (fedlm's own hooks "
             f"take a good part of a second on a large model: a shorter bound cuts them)")


def _check_sim(cfg: Config) -> None:
    s, i, f = cfg.sim, cfg.inner, cfg.fleet
    _require(s.ray_actors >= 0, "sim.ray_actors", s.ray_actors, "must be >= 0")
    _require(s.job_threads >= 1, "sim.job_threads", s.job_threads, "must be >= 1")
    _require(0 <= s.devices <= 1024, "sim.devices", s.devices, "must be in [0, 1024]")
    port = re.fullmatch(r"[\w.\-\[\]:]+:(\d{1,5})", s.ray_address)  # a socket's: 1-65535
    _require(s.ray_address in ("", "auto") or (port is not None and 1 <= int(port[1]) <= 65535),
             "sim.ray_address", s.ray_address, "must be HOST:PORT of a Ray head or auto")
    _require_choice("sim.batched", s.batched, BATCH_MODES)
    _require(s.batched != "on" or not i.compile, "sim.batched", s.batched,
             "trains without torch.compile: set inner.compile = false or sim.batched = off")
    _require(s.batched != "on" or i.optimizer == "adamw", "sim.batched", s.batched,
             f"stacks AdamW's state, not inner.optimizer {i.optimizer!r}'s: set sim.batched "
             f"= off")
    _require(s.batched != "on" or not (cfg.clock == "wall" and f.emulate_speed), "sim.batched",
             s.batched, "cannot pad each job's own compute (fleet.emulate_speed on the wall "
             "clock): set sim.batched = off")
    _require(s.cpus >= 0, "sim.cpus", s.cpus, "must be >= 0")
    _require(s.ttl > 0, "sim.ttl", s.ttl, "must be > 0")
    _require(s.reply_timeout > 0, "sim.reply_timeout", s.reply_timeout, "must be > 0")


def _check_track(cfg: Config) -> None:
    t = cfg.track
    for k, name in enumerate(t.backends):
        _require_choice(f"track.backends[{k}]", name, TRACKERS)
    _require(len(set(t.backends)) == len(t.backends), "track.backends", t.backends,
             "names a tracker twice")
    _require(t.dir.strip() != "", "track.dir", t.dir, "must be a folder path")
    _require(t.project.strip() != "", "track.project", t.project, "must not be empty")
    _require_choice("track.wandb_mode", t.wandb_mode, WANDB_MODES)


def notes(cfg: Config) -> list[str]:
    """Settings that load but do nothing in this config: one line each, for ``fedlm run``
    to say (a run must not take a setting silently and ignore it)."""
    out = []
    if cfg.grace != "auto" and traits(registry.strategy_class(cfg.strategy)).synchronous:
        out.append(f"grace = {cfg.grace} does nothing for the synchronous strategy "
                   f"{cfg.strategy!r}: its barrier already waits for every job of a round")
    return out
