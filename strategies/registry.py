"""Resolve strategy and local-steps names from config.

A name is, in this order:
  1. a built-in (``fedavg``, ``diloco``, ``delayed-nesterov``, ...);
  2. an entry point in the ``fedlm.strategies`` group of an installed package
     (``[project.entry-points."fedlm.strategies"] fedasync = "mypkg.fedasync:FedAsync"``);
  3. a dotted path ``package.module:ClassName`` importable from ``sys.path``.
Third-party strategies need no change to fedlm/ or strategies/.
"""

from __future__ import annotations

import importlib
import inspect
import json
from importlib.metadata import entry_points
from typing import Any

from fedlm.errors import ConfigError
from fedlm.strategies.async_nesterov import AsyncNesterov
from fedlm.strategies.async_sgd import AsyncSGD
from fedlm.strategies.base import Strategy
from fedlm.strategies.traits import traits
from fedlm.strategies.delayed_nesterov import DelayedNesterov
from fedlm.strategies.diloco import DiLoCo
from fedlm.strategies.diloco_dylu import DiLoCoDyLU
from fedlm.strategies.diloco_fill import DiLoCoFill
from fedlm.strategies.fedavg import FedAvg
from fedlm.strategies.fedbuff import FedBuff
from fedlm.strategies.halos import Halos
from fedlm.strategies.fill_steps import Fill, FillOnline, FillSizes
from fedlm.strategies.local_steps import (DyLU, DyLUFloor, DyLUOnline, DyLUPaper, DyLURtt,
                                          Fixed, LocalSteps)
from fedlm.strategies.poly import Poly, PolyThres
from fedlm.strategies.presence_steps import FillPresence

STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (
    FedAvg, DiLoCo, DiLoCoDyLU, DiLoCoFill, AsyncSGD, AsyncNesterov, DelayedNesterov, Poly, PolyThres,
    FedBuff, Halos)}
LOCAL_STEPS: dict[str, type[LocalSteps]] = {cls.name: cls for cls in (
    Fixed, DyLU, DyLUFloor, DyLUPaper, DyLURtt, DyLUOnline, Fill, FillOnline, FillSizes,
    FillPresence)}
ENTRY_POINT_GROUP = "fedlm.strategies"


def plugin_strategies() -> dict[str, str]:
    """Installed entry points: name -> "module:Class"."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_dotted(path: str, what: str = "strategy") -> Any:
    """The object at ``package.module:Name``; anything its import does wrong (an error,
    even ``SystemExit``) is a one-line ``ConfigError`` starting with ``what``."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what}: cannot import {module_name!r} ({exc})") from None
    except (ValueError, TypeError):  # not a module name at all (":x", ".:x"): the caller's
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a plug-in's own code failed
        raise ConfigError(f"{what}: importing {module_name!r} raised "
                          f"{type(exc).__name__}: {_first(exc)}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{what}: {module_name!r} has no {attr!r}") from None


def _first(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0][:200] if lines else "(no message)"


def strategy_class(name: str) -> type[Strategy]:
    if name in STRATEGIES:
        return STRATEGIES[name]
    plugins = plugin_strategies()
    if name in plugins:
        cls = load_dotted(plugins[name])
    elif ":" in name:
        cls = load_dotted(name)
    else:
        known = sorted(STRATEGIES) + sorted(plugins)
        raise ConfigError(f"strategy: unknown strategy {name!r} (known: {', '.join(known)}; "
                          f"or package.module:Class)")
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        old_path = isinstance(cls, type) and any(
            c.__module__ == "strategies.base" for c in cls.__mro__)
        hint = (" (it imports the old top-level `strategies` package: import from "
                "fedlm.strategies instead)") if old_path else ""
        raise ConfigError(f"strategy: {name!r} is not a fedlm.strategies.base.Strategy "
                          f"subclass{hint}")
    return cls


def constructors(cls: type) -> list:
    """The constructors that take a strategy's ``outer.*`` settings, its own first: its
    ``__init__``, and where that hands the rest on (``**kwargs``) its parent's, as far up
    as they are handed."""
    out = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        out.append(klass.__init__)
        if not any(p.kind is p.VAR_KEYWORD
                   for p in inspect.signature(klass.__init__).parameters.values()):
            break
    return out


def settings_of(cls: type) -> dict[str, inspect.Parameter]:
    """A strategy's ``outer.*`` settings: the keyword arguments of its ``constructors``."""
    out: dict[str, inspect.Parameter] = {}
    for init in constructors(cls):
        params = inspect.signature(init).parameters
        named = {k: p for k, p in params.items() if k != "self" and p.kind not in
                 (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        out = {**named, **out}  # a subclass's default wins over its parent's
    return out


def check_strategy(name: str, outer: dict[str, Any]) -> Strategy:
    """Refuse an unknown strategy or an ``outer.*`` key its constructor lacks; the
    strategy built (its constructor checks the ranges)."""
    cls = strategy_class(name)
    accepted = settings_of(cls)
    for key in outer:
        if key not in accepted:
            known = ", ".join(accepted) or "none"
            raise ConfigError(f"outer.{key}: not a setting of {name!r} (known: {known})")
    trial = _construct(name, outer)  # range checks live in the constructor
    _TRIAL.clear()
    _TRIAL[_trial_key(name, outer)] = trial
    return trial


# The config check's trial strategy, kept until a run of the same settings asks for its
# strategy: a run builds its strategy once (the check's construction is the run's), not
# once to check, once to announce and once to run. Only the newest trial is kept.
_TRIAL: dict[str, Strategy] = {}


def _trial_key(name: str, outer: dict[str, Any]) -> str:
    return json.dumps([name, outer], sort_keys=True, default=repr)


def build_strategy(name: str, outer: dict[str, Any]) -> Strategy:
    """Strategy ``name`` with its ``outer.*`` settings: the config check's trial of these
    settings where it is still unclaimed (it was built and checked then), else a new
    one."""
    trial = _TRIAL.pop(_trial_key(name, outer), None)
    return trial if trial is not None else _construct(name, outer)


def _construct(name: str, outer: dict[str, Any]) -> Strategy:
    cls = strategy_class(name)
    try:
        return cls(**outer)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None


def check_local_steps(name: str) -> None:
    if name not in LOCAL_STEPS:
        raise ConfigError(f"local_steps: unknown policy {name!r} "
                          f"(known: {', '.join(sorted(LOCAL_STEPS))})")


def local_steps_for(strategy: str, policy: str, *, given: bool) -> str:
    """The local-steps policy a run of ``strategy`` gets (``fedlm.config_load`` asks when
    it loads a config). ``policy`` is the config's ``local_steps``; ``given`` whether the
    config set it, or left the schema's default. A strategy class may name its own
    policy, used where the config leaves it out (``default_local_steps``), and refuse
    some (``refused_local_steps``: policy -> hint, a one-line ``ConfigError``); e.g.
    ``diloco-dylu``: ``dylu``, and ``fixed`` refused. An unknown or broken strategy
    keeps ``policy``: ``config_check.validate`` then says what is wrong with it."""
    try:
        cls = strategy_class(strategy)
    except Exception:
        return policy
    if not given:
        return traits(cls).default_local_steps or policy
    refused = traits(cls).refused_local_steps
    if policy in refused:
        raise ConfigError(f"local_steps: {policy!r} does not go with strategy {strategy!r}: "
                          f"{refused[policy]}")
    return policy


def build_local_steps(name: str) -> LocalSteps:
    check_local_steps(name)
    return LOCAL_STEPS[name]()


def describe() -> list[tuple[str, str, str, str]]:
    """(name, kind, first docstring line, source) for every strategy and policy; the
    source says whether it follows its paper, is a reconstruction, or is fedlm's own."""
    rows = []
    for name, cls in sorted(STRATEGIES.items()):
        kind = "sync" if traits(cls).synchronous else "async"
        rows.append((name, kind, _first_line(cls), cls.source))
    for name, target in sorted(plugin_strategies().items()):
        try:
            cls = strategy_class(name)
            rows.append((name, "plugin", f"{_first_line(cls)} [{target}]",
                         getattr(cls, "source", "")))
        except Exception as exc:  # a broken plugin must not hide the others
            rows.append((name, "plugin", f"cannot load {target}: {exc}", ""))
    for name, cls in sorted(LOCAL_STEPS.items()):
        rows.append((name, "local_steps", _first_line(cls), cls.source))
    return rows


def _first_line(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return doc.splitlines()[0] if doc else ""
