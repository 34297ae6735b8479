"""A config value against its annotated type (``coerce``): what ``fedlm.config_load``
does to every key of a ``Config`` and a server kind's settings
(``fedlm.servers.settings``) to each of its own. Each refusal is a one-line
``ConfigError`` naming the field and the value. Standard library only (and
``fedlm.errors``), as ``fedlm.config``.
"""

from __future__ import annotations

import math
from typing import Any

from fedlm.errors import ConfigError, shown


def coerce(path: str, value: Any, typ: Any) -> Any:
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
                raise ConfigError(f"{path}: must not contain NUL characters, got {shown(value)}")
            return value
    elif typ == list[float]:
        if isinstance(value, list) and all(_is_number(v) for v in value):
            return [_finite(f"{path}[{k}]", v) for k, v in enumerate(value)]
    elif typ == list[int]:
        if isinstance(value, list) and all(_is_number(v) and isinstance(v, int) for v in value):
            return [_int64(f"{path}[{k}]", v) for k, v in enumerate(value)]
    elif typ == list[str]:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [coerce(f"{path}[{k}]", v, str) for k, v in enumerate(value)]
    elif typ == dict[str, Any]:
        if isinstance(value, dict):
            return dict(value)
    elif typ == float | str:  # a number or a word (stream.mix: 0.5 or "auto")
        if isinstance(value, str):
            return coerce(path, value, str)
        if _is_number(value):
            return _finite(path, value)
    name = _TYPE_NAMES.get(typ) or getattr(typ, "__name__", str(typ))
    raise ConfigError(f"{path}: expected {name}, got {shown(value)}")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_TYPE_NAMES = {list[float]: "a list of numbers", list[int]: "a list of integers",
               list[str]: "a list of strings", dict[str, Any]: "a table",
               float | str: "a number or a word"}


def _int64(path: str, value: int) -> int:
    """Ints must fit the run store (SQLite INTEGER) and torch seeds: 64 bits, signed."""
    if not -(2**63) <= value < 2**63:
        raise ConfigError(f"{path}: must be an integer in [-2**63, 2**63), got {shown(value)}")
    return value


def _finite(path: str, value: int | float) -> float:
    """NaN and infinities are refused for every float setting (0 means "off" where
    a setting can be off)."""
    try:
        result = float(value)
    except OverflowError:  # an int past float range
        result = math.inf
    if not math.isfinite(result):
        raise ConfigError(f"{path}: must be a finite number, got {shown(value)}")
    return result
