"""Errors that more than one layer raises or catches, and how a value or a key is
shown in their one-line messages.

Imports nothing of ours, so any module (the config schema, the loader, the
strategy registry, the model) may raise them without importing another.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """Bad configuration; the message is one line naming the field and value."""


def shown(value: Any, limit: int = 200) -> str:
    """repr() for messages: never raises (ints past 4300 digits do), never long."""
    try:
        text = repr(value)
    except ValueError:
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) \
            else f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def shown_key(name: str) -> str:
    """A key or path for a message: quoted when empty, blank at either end or holding
    unprintable characters (so a message never starts or ends with white space)."""
    plain = name and name.isprintable() and name == name.strip()
    return name if plain else repr(name)


def first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__


def require(ok: bool, path: str, value: Any, why: str) -> None:
    """A config check: ``ConfigError`` ("PATH: WHY, got VALUE") unless ``ok``."""
    if not ok:
        raise ConfigError(f"{path}: {why}, got {shown(value)}")

