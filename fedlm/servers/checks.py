"""What any kind of server needs of a config, checked together (``check_exchange``,
called by ``fedlm.config_check.validate``): the kind and what it serves (``Serves``), the
network topology, a strategy that names its own kind; then the kind's own rules (its
classmethod ``check``: Streaming DiLoCo's rounds are ``StreamedServer.check``'s). Each
refusal is one line naming the field."""

from __future__ import annotations

from fedlm.config import Config
from fedlm.errors import ConfigError, require
from fedlm.servers import Server, kind_name, made_from, server_class
from fedlm.servers.kind import OLD_CAPABILITIES
from fedlm.servers.settings import settings_of, suggestion
from fedlm.servers.streamed import StreamedServer
from fedlm.strategies.traits import traits


def _check_own_kind(cfg: Config, cls, kind: type[Server], name: str) -> None:
    """A strategy that names its kind of server (``default_server``) runs on that kind,
    or on one made from it: the kind's hooks are half the method (HALoS's region and
    global servers, a deadline round, DES-LOC's desynchronised state). On another its
    own settings would apply nowhere, or it would fail mid-run."""
    own = suggestion(cls).kind
    if not own or name == own:
        return
    require(made_from(cfg, kind, own), "server", name,
             f"strategy {cfg.strategy!r} runs on its own kind of server ({own!r}, its "
             f"default_server, or one made from it): leave server unset")


def check_exchange(cfg: Config) -> None:
    """What an all-reduce topology and Streaming DiLoCo's rounds need: every worker
    in every round (a synchronous strategy), and a timing model without a shared
    server link (``fedlm.sim.collectives``)."""
    from fedlm.strategies import fragments
    from fedlm.strategies.registry import strategy_class

    try:
        stream = fragments.Streaming.of_config(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    cls = strategy_class(cfg.strategy)
    named = getattr(cls, "server", None)  # where a strategy named its server before
    require(not (isinstance(named, str) and named), "strategy", cfg.strategy,
             f"names its server in `server` ({named!r}), which fedlm no longer reads: call "
             f"it default_server, or set server = {named!r} in the config")
    n = cfg.network
    shared = n.server_down > 0 or n.server_up > 0 or n.daily_amplitude > 0
    if n.topology in ("ring", "tree"):
        require(traits(cls).synchronous, "network.topology", n.topology,
                 f"an all-reduce needs every worker each round: a synchronous strategy "
                 f"(diloco, fedavg), not {cfg.strategy!r}")
        require(not shared, "network.topology", n.topology,
                 "has no server: drop network.server_down, server_up and daily_amplitude")
    kind = server_class(cfg)
    name = kind_name(cfg)
    old = [a for a in OLD_CAPABILITIES if hasattr(kind, a)]
    require(not old, "server", name, f"declares what it serves in class attributes "
            f"({', '.join(old)}), which fedlm no longer reads: declare serves = "
            f"fedlm.servers.Serves(...) instead (docs/strategies.md)")
    _check_own_kind(cfg, cls, kind, name)
    own = issubclass(kind, Server) and kind.send is Server.send and kind.timing is Server.timing
    require(not cfg.network.slow_compression or own, "network.slow_compression",
            cfg.network.slow_compression, f"the server kind {kind.__name__} sends or times "
            f"its own jobs; per-link encodings need the one-server kind's")
    # a shared link times every job by its flows (fedlm.sim.network): a kind that times
    # its own jobs (an overlapped exchange, say) would lose its timing there, silently
    times_its_own = getattr(kind, "timing", Server.timing) is not Server.timing
    require(not (shared and times_its_own), "network.server_up",
            n.server_up or n.server_down or n.daily_amplitude,
            f"{cfg.strategy!r}'s server times its own jobs ({kind.__name__}.timing), which a "
            f"shared server link cannot: drop network.server_down, server_up and "
            f"daily_amplitude")
    if not kind.serves.shared_link:  # each worker's link timed on its own
        require(n.topology == "star" and not n.hierarchical, "network.topology", n.topology,
                 f"server {name!r} times each worker's own link (region servers, a "
                 f"pipeline): use the star topology without network.hierarchical")
        require(not (n.server_down or n.server_up), "network.server_up",
                 n.server_up or n.server_down, f"server {name!r} times each worker's own "
                 f"link, not a shared one: drop network.server_down and server_up")
    settings_of(cfg, kind)  # its own settings: each known, typed and in range
    try:
        kind.check(cfg, cls)
    except ConfigError:
        raise  # it names its own field (a plug-in's outer.* setting, say)
    except ValueError as exc:
        raise ConfigError(f"server: {str(exc).splitlines()[0]}") from None
    require(kind.serves.synchronous or not traits(cls).synchronous, "server", name,
             f"runs an asynchronous strategy (halos, delayed-nesterov, ...): each update "
             f"is taken on its own, not in {cfg.strategy!r}'s rounds")
    # the [stream] section is the streamed kind's (its rules: StreamedServer.check)
    require(stream is None or issubclass(kind, StreamedServer), "stream.fragments",
             cfg.stream.fragments, f"streaming rounds run on server = 'streamed' (or a kind "
             f"made from it), not {name!r}")
