"""The ``[server]`` section: which kind of server a run has (``fedlm.servers``) and that
kind's own settings, the section's other keys (a region server's ``merge`` and
``push_every``, a deadline round's ``deadline_k``): settings of the kind, not of the
strategy it serves.

    [server]
    kind = "regions"
    merge = 0.5
    push_every = 4

``server = "regions"`` (a kind alone, the spelling of before) reads as ``[server] kind =
"regions"``. What each kind takes, and its checks, is the kind's ``Settings``
(``fedlm.servers.settings``). Standard library only, as ``fedlm.config``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ServerConfig:
    """The kind of server and its settings."""

    # one | streamed (Streaming DiLoCo's fragments) | regions (a server in every region and
    # a global one) | package.module:Class of your own; "" = chosen as the config loads:
    # the strategy's default_server (halos: regions), else streamed where [stream] asks
    # for it, else one.
    kind: str = ""
    # the kind's own settings: the section's other keys
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The section as TOML spells it: ``kind`` and the settings beside it."""
        return {"kind": self.kind, **self.settings}
