"""The server side of a run: the calls the engine and replay make (``calls.ServerCalls``)
and the kinds of server they drive (``protocol.Server`` and its subclasses).

    one        Server: one server (every flat strategy)
    streamed   StreamedServer: Streaming DiLoCo's rounds of fragments (``[stream]``)
    regions    RegionServers: a server in every region and a global one (halos)

The config names the kind (``[server]``'s ``kind``: one of these, or ``package.module:Class`` for a
plug-in's own). Where it names none, ``default_kind`` picks it when the config loads:
the strategy's suggestion (a class attribute ``default_server``, as
``default_local_steps`` suggests a local-steps policy), else ``streamed`` where the
``[stream]`` section asks for streaming, else ``one``. ``server_class`` is the one
place a kind is looked up; the kind's own settings, the section's other keys, are its
``Settings`` (``settings``). Each call into a kind is bounded in wall-clock time
(``watch.HookWatch``, ``reliability.hook_timeout``).
"""

from __future__ import annotations

from dataclasses import replace

from fedlm.config import Config, ServerConfig
from fedlm.errors import ConfigError
from fedlm.servers import settings
from fedlm.servers.calls import ServerCalls, Version
from fedlm.servers.kind import Alarm, JobClock, Message, Sent, ServerKind, Serves
from fedlm.servers.protocol import Server
from fedlm.servers.watch import HookTimeout, HookWatch
from fedlm.strategies.base import Strategy

__all__ = ["KINDS", "Alarm", "HookTimeout", "HookWatch", "JobClock", "Message", "Sent", "Server",
           "ServerCalls", "ServerKind", "Serves", "Version", "build",
           "default_kind", "kind_name", "made_from", "resolve", "server_class", "settings", "summary"]

KINDS = {"one": "fedlm.servers.protocol:Server",
         "streamed": "fedlm.servers.streamed:StreamedServer",
         "regions": "fedlm.servers.regions:RegionServers"}


def _suggested(cfg: Config) -> str:
    """The kind the config's strategy suggests ("": none)."""
    from fedlm.strategies.registry import strategy_class

    try:
        return settings.suggestion(strategy_class(cfg.strategy)).kind
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
    """The config's kind of server: its ``server.kind``, or the default where it has none."""
    return cfg.server.kind or default_kind(cfg)


def server_class(cfg: Config) -> type[ServerKind]:
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
    if not (isinstance(kind, type) and issubclass(kind, ServerKind)):
        raise ConfigError(f"{what}: {name!r} is not a kind of server (a subclass of "
                          f"fedlm.servers.Server or ServerKind)")
    return kind


def made_from(cfg: Config, kind: type[ServerKind], name: str) -> bool:
    """Whether ``kind`` is the kind ``name`` names, or one made from it (a subclass)."""
    return issubclass(kind, server_class(replace(cfg, server=ServerConfig(kind=name))))


def resolve(cfg: Config) -> Config:
    """``cfg`` with its kind named (``default_kind`` where it names none) and the kind's
    settings gathered (``settings.gathered``: the strategy's suggestion, the old names in
    [outer], the [server] section). A kind or strategy that does not load is left for
    the config's checks to report."""
    from fedlm.strategies.registry import settings_of, strategy_class

    cfg = replace(cfg, server=replace(cfg.server, kind=kind_name(cfg)))
    try:
        strategy = strategy_class(cfg.strategy)
        kind = server_class(cfg)
        own = settings.suggestion(strategy).kind
        suggested = bool(own) and made_from(cfg, kind, own)
    except Exception:  # noqa: BLE001 - the config's checks say what is wrong
        return cfg
    return settings.gathered(cfg, strategy, kind, suggested=suggested,
                             taken=set(settings_of(strategy)))


def build(cfg: Config, strategy: Strategy | None = None) -> ServerKind:
    """The server kind of ``cfg`` with the strategy instances it needs (``ServerCalls``
    drives it): the one place a strategy is made from a config. ``strategy``: one made
    already (tests, benchmarks) in place of the config's own."""
    from fedlm.strategies.registry import build_strategy

    if strategy is None:
        strategy = build_strategy(cfg.strategy, cfg.outer)
    return server_class(cfg)(cfg, strategy)


def summary(server: ServerKind) -> str:
    """One line of a built server's settings, as the run store keeps it: its strategy's
    summary, then the kind's own words where it has any (``describe``)."""
    return "; ".join(filter(None, [server.strategy.summary(), server.describe()]))

