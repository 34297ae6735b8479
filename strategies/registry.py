"""Resolve strategy and local-steps names from config."""

from __future__ import annotations

import inspect
from typing import Any

from strategies.base import Strategy
from strategies.diloco import DiLoCo
from strategies.fedavg import FedAvg
from strategies.local_steps import Fixed, LocalSteps

STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (FedAvg, DiLoCo)}
LOCAL_STEPS: dict[str, type[LocalSteps]] = {cls.name: cls for cls in (Fixed,)}


def _config_error(msg: str) -> Exception:
    from fedlm.config import ConfigError

    return ConfigError(msg)


def strategy_class(name: str) -> type[Strategy]:
    if name not in STRATEGIES:
        raise _config_error(f"strategy: unknown strategy {name!r} "
                            f"(known: {', '.join(sorted(STRATEGIES))})")
    return STRATEGIES[name]


def check_strategy(name: str, outer: dict[str, Any]) -> None:
    """Refuse an unknown strategy or an ``outer.*`` key its constructor lacks."""
    cls = strategy_class(name)
    accepted = inspect.signature(cls.__init__).parameters
    for key in outer:
        if key not in accepted or key == "self":
            known = ", ".join(k for k in accepted if k != "self")
            raise _config_error(f"outer.{key}: not a setting of {name!r} (known: {known})")
    build_strategy(name, outer)  # range checks live in the constructor


def build_strategy(name: str, outer: dict[str, Any]) -> Strategy:
    try:
        return strategy_class(name)(**outer)
    except (TypeError, ValueError) as exc:
        raise _config_error(str(exc).splitlines()[0]) from None


def check_local_steps(name: str) -> None:
    if name not in LOCAL_STEPS:
        raise _config_error(f"local_steps: unknown policy {name!r} "
                            f"(known: {', '.join(sorted(LOCAL_STEPS))})")


def build_local_steps(name: str) -> LocalSteps:
    check_local_steps(name)
    return LOCAL_STEPS[name]()
