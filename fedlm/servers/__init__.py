"""The server side of a run: the calls the engine and replay make (``calls.ServerCalls``)
and the kinds of server they drive (``protocol.Server`` and its subclasses).

    one        Server: one server (every flat strategy)
    streamed   StreamedServer: Streaming DiLoCo's rounds of fragments (``[stream]``)
    regions    RegionServers: a server in every region and a global one (halos)

The config names the kind (``server``: one of these, or ``package.module:Class`` for a
plug-in's own). Where it names none, ``default_kind`` picks it when the config loads:
the strategy's suggestion (a class attribute ``default_server``, as
``default_local_steps`` suggests a local-steps policy), else ``streamed`` where the
``[stream]`` section asks for streaming, else ``one``. ``server_class`` is the one
place a kind is looked up. Each call into a kind is bounded in wall-clock time
(``watch.HookWatch``, ``reliability.hook_timeout``).
"""

from __future__ import annotations

from fedlm.config import Config
from fedlm.errors import ConfigError
from fedlm.servers.calls import ServerCalls, Version
from fedlm.servers.protocol import Alarm, JobClock, Message, Sent, Server, Serves
from fedlm.servers.watch import HookTimeout, HookWatch
from fedlm.strategies.base import Strategy

__all__ = ["KINDS", "Alarm", "HookTimeout", "HookWatch", "JobClock", "Message", "Sent", "Server", "ServerCalls", "Serves", "Version", "build",
           "default_kind", "kind_name", "server_class", "summary"]

KINDS = {"one": "fedlm.servers.protocol:Server",
         "streamed": "fedlm.servers.streamed:StreamedServer",
         "regions": "fedlm.servers.regions:RegionServers"}


def _suggested(cfg: Config) -> str:
    """The kind the config's strategy suggests ("": none)."""
    from fedlm.strategies.registry import strategy_class

    try:
        return strategy_class(cfg.strategy).default_server
    except Exception:  # noqa: BLE001 - config_check reports a strategy that fails to load
        return ""


def default_kind(cfg: Config) -> str:
    """The kind of server a config that names none gets (an unknown strategy or bad
    ``[stream]`` gets ``one``: the config's checks then say what is wrong)."""
    from fedlm.strategies.fragments import Streaming

    suggested = _suggested(cfg)
    if suggested:
        return suggested
    try:
        return "one" if Streaming.of_config(cfg) is None else "streamed"
    except ValueError:
        return "one"


def kind_name(cfg: Config) -> str:
    """The config's kind of server: its ``server``, or the default where it has none."""
    return cfg.server or default_kind(cfg)


def server_class(cfg: Config) -> type[Server]:
    """The kind of server ``cfg``'s run has."""
    from fedlm.strategies.registry import load_dotted

    name = kind_name(cfg)
    # a kind the config took from its strategy: say so
    what = (f"server (the default of strategy {cfg.strategy!r})"
            if name not in KINDS and name == _suggested(cfg) else "server")
    path = KINDS.get(name, name)
    if ":" not in path:
        raise ConfigError(f"{what}: unknown kind {name!r} (known: {', '.join(KINDS)}; "
                          f"or package.module:Class)")
    try:
        kind = load_dotted(path, what)
    except ConfigError:
        raise
    except (ValueError, TypeError):  # not a "package.module:Class" at all
        raise ConfigError(f"{what}: {name!r} is not a package.module:Class path") from None
    if not (isinstance(kind, type) and issubclass(kind, Server)):
        raise ConfigError(f"{what}: {name!r} is not a fedlm.servers.Server subclass")
    return kind


def build(cfg: Config, strategy: Strategy | None = None) -> Server:
    """The server kind of ``cfg`` with the strategy instances it needs (``ServerCalls``
    drives it): the one place a strategy is made from a config. ``strategy``: one made
    already (tests, benchmarks) in place of the config's own."""
    from fedlm.strategies.registry import build_strategy

    if strategy is None:
        strategy = build_strategy(cfg.strategy, cfg.outer)
    return server_class(cfg)(cfg, strategy)


def summary(server: Server) -> str:
    """One line of a built server's settings, as the run store keeps it: its strategy's
    summary (the kind, where it is not one server, says itself in ``describe``)."""
    return server.strategy.summary()

