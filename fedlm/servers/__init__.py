"""The server side of a run: one protocol (``protocol.Server``) and its kinds.

    Server          one server (every flat strategy)
    StreamedServer  Streaming DiLoCo's rounds of fragments (``stream.fragments``,
                    ``stream.overlap``, ``stream.mix``)
    RegionServers   a server in every region and a global one (``strategy = halos``)

A strategy names the kind it needs in ``Strategy.server`` (a dotted path
``package.module:Class``; empty for one server), so a plug-in brings its own kind
without touching the engine. ``server_class`` is the one place a kind is chosen.
"""

from __future__ import annotations

from fedlm.config import Config
from fedlm.errors import ConfigError
from fedlm.servers.protocol import Sent, Server
from fedlm.strategies.base import Strategy

__all__ = ["Sent", "Server", "build", "server_class"]


def server_class(cfg: Config, strategy: type[Strategy] | Strategy) -> type[Server]:
    """The kind of server ``cfg``'s run has."""
    from fedlm.strategies.fragments import Streaming
    from fedlm.strategies.registry import load_dotted

    if strategy.server:
        what = f"strategy {strategy.name!r}: its server {strategy.server!r}"
        try:
            kind = load_dotted(strategy.server, what)
        except (ValueError, TypeError) as exc:  # not a "package.module:Class" at all
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{what} is not a package.module:Class path") from None
        if not (isinstance(kind, type) and issubclass(kind, Server)):
            raise ConfigError(f"strategy {strategy.name!r}: its server {strategy.server!r} "
                              f"is not a fedlm.servers.Server subclass")
        return kind
    if Streaming.of_config(cfg) is not None:
        from fedlm.servers.streamed import StreamedServer
        return StreamedServer
    return Server


def build(cfg: Config, strategy: Strategy) -> Server:
    return server_class(cfg, strategy)(cfg, strategy)
