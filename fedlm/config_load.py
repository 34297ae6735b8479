"""Build a validated ``Config`` from a TOML file, ``--set`` overrides or stored JSON.

A run is described by one TOML file (or the embedded default) plus ``--set
key=value`` overrides. Everything is checked here, at the boundary: an unknown
key, a value of the wrong type or out of range is refused with a
``ConfigError`` whose one-line message names the field and the value. Names are
checked against what they name (``fedlm.config_check``); nothing here imports
torch, so loading a config does not either.

    load(path, overrides)   a TOML file (or the defaults) + ``--set key=value``
    from_dict(raw)          plain data, e.g. parsed TOML
    from_json(text)         ``Config.to_json()`` output, e.g. a stored run's config

The schema itself (sections, keys, defaults) is ``fedlm.config``.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, get_type_hints

from fedlm import files, servers
from fedlm.config import MOVED, SECTIONS, SPELLING, Config, ServerConfig
from fedlm.config_check import coerce, validate
from fedlm.errors import ConfigError, first_line, shown, shown_key
from fedlm.servers.watch import bounded, plug_in_bound
from fedlm.strategies import registry


# -- building and validating -------------------------------------------------


# TOML spelling -> attribute name (``SPELLING`` the other way).
_ATTRIBUTE = {v: k for k, v in SPELLING.items()}
# Keys renamed to say what they mean: the old name still reads (configs and sweep
# specs written before, and the config every stored run keeps), as the new one.
RENAMED = {"concurrency": "max_in_flight", "sim.actors": "sim.ray_actors",
           "sim.concurrent_jobs": "sim.job_threads"}
# Text keys that may hold a bare number (``--set init.from=7`` parses 7 as an int).
_NUMBER_AS_TEXT = {"from_", "grace"}


def _build(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    hints = get_type_hints(cls)
    known = {SPELLING.get(f.name, f.name) for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a table, got {shown(raw)}")
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if path in RENAMED:
            new = RENAMED[path].rsplit(".", 1)[-1]
            if new in raw:
                raise ConfigError(f"{path}: the old name of {RENAMED[path]}; give only one")
            key, path = new, RENAMED[path]
        if key not in known:
            raise ConfigError(f"{shown_key(path)}: unknown key (known: {', '.join(sorted(known))})")
        key = _ATTRIBUTE.get(key, key)
        typ = hints[key]
        if key in _NUMBER_AS_TEXT and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            value = str(value)
        if key == "server" and cls is Config:
            kwargs[key] = _server_section(value)
        elif key in SECTIONS and cls is Config:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: expected a [{key}] section, got {shown(value)}")
            kwargs[key] = _build(SECTIONS[key], value, f"{path}.")
        else:
            kwargs[key] = coerce(path, value, typ)
    return cls(**kwargs)


def _server_section(value: Any) -> ServerConfig:
    """``[server]``: ``kind`` and the kind's settings beside it; or a kind alone (``server
    = "regions"``, the spelling of before). The settings are the kind's to check."""
    if isinstance(value, str):
        return ServerConfig(kind=coerce("server", value, str))
    if not isinstance(value, dict):
        raise ConfigError(f"server: expected a kind or a [server] section, got {shown(value)}")
    settings = {k: v for k, v in value.items() if k != "kind"}
    bad = [k for k in settings if not (isinstance(k, str) and k.isidentifier())]
    if bad:
        raise ConfigError(f"server: {shown_key(str(bad[0]))} is not a setting's name")
    return ServerConfig(kind=coerce("server.kind", value.get("kind", ""), str),
                        settings=settings)


def _moved(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the keys of ``MOVED`` at their new place (a copy where any moved)."""
    if not isinstance(raw, dict):
        return raw  # _build says what is wrong with it
    for old, new in MOVED.items():
        (osec, okey), (nsec, nkey) = old.split("."), new.split(".")
        if not (isinstance(raw.get(osec), dict) and okey in raw[osec]):
            continue
        if not isinstance(raw.get(nsec, {}), dict):
            continue  # _build says what is wrong with it
        if nkey in raw.get(nsec, {}):
            raise ConfigError(f"{old}: the old name of {new}; give only one")
        raw = {**raw, osec: {k: v for k, v in raw[osec].items() if k != okey},
               nsec: {**raw.get(nsec, {}), nkey: raw[osec][okey]}}
    return raw


def from_dict(raw: dict[str, Any]) -> Config:
    """Build a ``Config`` from plain data and validate it. The plug-in code the config
    names (its strategy's module and constructor, a server kind's check, a codec, an
    optimizer factory's module) runs bounded by its ``reliability.hook_timeout``."""
    raw = _moved(raw)
    cfg = _build(Config, raw, "")
    return bounded(plug_in_bound(cfg), "loading the config's plug-in code (strategy, "
                   "server kind, codec, inner.optimizer)", _complete, cfg, raw)


def _complete(cfg: Config, raw: dict[str, Any]) -> Config:
    """The settings a config takes from its strategy, then every check."""
    # a strategy may name its own local-steps policy (diloco-dylu: dylu) and refuse some
    policy = registry.local_steps_for(cfg.strategy, cfg.local_steps, given="local_steps" in raw)
    if policy != cfg.local_steps:
        cfg = replace(cfg, local_steps=policy)
    # the kind of server, as named or as the strategy suggests it (halos: regions), with
    # its settings, some of which older configs gave in [outer]
    cfg = servers.resolve(cfg)
    net = cfg.network
    # One idea, two spellings: network.hierarchical = true is topology "hierarchical"
    if net.topology == "hierarchical" and not net.hierarchical:
        cfg = replace(cfg, network=replace(net, hierarchical=True))
    elif net.hierarchical and net.topology == "star":
        cfg = replace(cfg, network=replace(net, topology="hierarchical"))
    validate(cfg)
    _refuse_moved_names(registry.strategy_class(cfg.strategy))  # it loads: validate says so
    return cfg


def _refuse_moved_names(cls: type) -> None:
    """A strategy's constructor may not take a setting whose ``outer.`` name fedlm reads
    as another section's old name (``outer.mix`` is ``stream.mix``): it could never be set,
    and a value given for it would go to the other section without a word."""
    for name in registry.settings_of(cls):  # its parents' too, where handed on
        if f"outer.{name}" in MOVED:
            raise ConfigError(f"strategy {cls.__name__}: its setting {name!r} cannot be given: "
                              f"fedlm reads outer.{name} as {MOVED[f'outer.{name}']}; "
                              f"rename the argument")


def from_json(text: str) -> Config:
    """The ``Config`` that ``Config.to_json()`` wrote (a stored run's), validated again."""
    return from_dict(json.loads(text))


# -- files and --set overrides -----------------------------------------------

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
        raise ConfigError(f"--set {shown_key(assignment)}: expected key=value")
    key, text = assignment.split("=", 1)
    key = ALIASES.get(key.strip(), key.strip())
    key = MOVED.get(key, RENAMED.get(key, key))
    if not key:
        raise ConfigError(f"--set {shown_key(assignment)}: empty key")
    parts = key.split(".")
    if parts[0] == "server" and len(parts) > 1 and isinstance(raw.get("server"), str):
        raw["server"] = {"kind": raw["server"]}  # a kind alone, and now one of its settings
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{shown_key(key)}: {shown_key(part)} is not a section")
        node = child
    node[parts[-1]] = parse_value(text.strip())


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """A TOML file as a dict; anything wrong with it is a one-line ``ConfigError``
    starting with ``what`` (a config, a sweep spec)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what}: {shown_key(str(p))} is a directory, not a TOML file")
    if not p.exists():
        raise ConfigError(f"{what}: no such file {str(p)!r}")
    try:
        return tomllib.loads(files.read_text(p, "config"))  # a FIFO, a device: refused
    except files.FileRefused as exc:
        raise ConfigError(f"{what}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what}: {shown_key(str(p))}: not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from None
    except RecursionError:
        raise ConfigError(f"{what}: {shown_key(str(p))}: nested too deeply") from None
    except ValueError as exc:  # TOMLDecodeError; an int past 4300 digits
        raise ConfigError(f"{what}: {shown_key(str(p))}: {first_line(exc)}") from None


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a TOML config (or the defaults), apply ``--set`` overrides, validate."""
    raw: dict[str, Any] = {} if path is None else read_toml(path, "config")
    for assignment in overrides:
        apply_override(raw, assignment)
    return from_dict(raw)
