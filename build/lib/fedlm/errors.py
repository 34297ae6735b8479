"""Errors that more than one layer raises or catches.

Imports nothing of ours, so any module (the config schema, the loader, the
strategy registry, the model) may raise them without importing another.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad configuration; the message is one line naming the field and value."""
