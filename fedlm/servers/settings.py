"""A server kind's own settings (``[server]``, ``fedlm.config.server``): what a kind takes,
declared as data in its class attribute ``Settings`` (a frozen dataclass: each field
with its default, a ``__post_init__`` that refuses a bad value in one line), and how a
config's section becomes them.

    gathered(cfg, ...)      the config with its kind's settings gathered (as it loads:
                            ``fedlm.servers.resolve``)
    settings_of(cfg, kind)  the kind's ``Settings`` of such a config (one-line refusals)

A kind's settings come from, later ones winning:

1. its ``Settings``' defaults;
2. its strategy's suggestion, where the kind is the one the strategy suggests or one
   made from it (its ``default_server`` as a table: HALoS's constants for the region
   servers);
3. the spelling of before: a key of ``[outer]`` that the strategy does not take and the
   kind's ``Settings`` names in ``OLD_NAMES`` (``outer.push_every`` is
   ``server.push_every``), so that older configs and every stored run load as they ran;
4. the config's ``[server]`` section.

``gathered`` writes 2 to 4 into the config (its settings are then whole in the run's
stored config) and takes the moved keys out of ``[outer]``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any, ClassVar, get_type_hints

from fedlm.config import Config, ServerConfig
from fedlm.config.values import coerce
from fedlm.errors import ConfigError, first_line
from fedlm.strategies.traits import traits


@dataclass(frozen=True)
class NoSettings:
    """The settings of a kind that takes none (one server, most plug-ins)."""

    OLD_NAMES: ClassVar[dict[str, str]] = {}  # an [outer] key of before -> its setting


def suggestion(strategy: type) -> ServerConfig:
    """The kind (and settings) ``strategy`` suggests: its ``default_server``, a kind's
    name or a table spelt as ``[server]`` is."""
    own = traits(strategy).default_server
    if isinstance(own, dict):
        return ServerConfig(kind=str(own.get("kind", "")),
                            settings={k: v for k, v in own.items() if k != "kind"})
    return ServerConfig(kind=own if isinstance(own, str) else "")


def _merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``more`` over ``base``; a table in both is merged key by key (one level)."""
    out = dict(base)
    for k, v in more.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _old_spelling(cfg: Config, kind: type,
                  taken: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the kind's settings given in [outer] under their old names, the [outer] left);
    ``taken``: the strategy's own settings, which stay its own."""
    old = getattr(getattr(kind, "Settings", NoSettings), "OLD_NAMES", {})
    keys = [k for k in cfg.outer if k in old and k not in taken]
    moved: dict[str, Any] = {}
    for key in keys:
        node, *path = old[key].split(".")
        moved = _merged(moved, {node: _nested(path, cfg.outer[key])})
    return moved, {k: v for k, v in cfg.outer.items() if k not in keys}


def _nested(path: list[str], value: Any) -> Any:
    """``value`` under the keys of ``path`` (``["lr"]``, 0.3: ``{"lr": 0.3}``)."""
    for part in reversed(path):
        value = {part: value}
    return value


def gathered(cfg: Config, strategy: type, kind: type, *, suggested: bool,
             taken: set[str]) -> Config:
    """``cfg`` with its kind's settings gathered (2 to 4 above; ``suggested``: whether the
    kind is the strategy's or one made from it; ``taken``: the strategy's own settings)
    and the moved keys out of [outer]."""
    settings = dict(suggestion(strategy).settings) if suggested else {}
    given_old, outer = _old_spelling(cfg, kind, taken)
    for key in given_old:
        if key in cfg.server.settings:
            raise ConfigError(f"server.{key}: also given under its old name in [outer]; "
                              f"give only server.{key}")
    settings = _merged(_merged(settings, given_old), cfg.server.settings)
    return replace(cfg, outer=outer, server=replace(cfg.server, settings=settings))


def settings_of(cfg: Config, kind: type) -> Any:
    """``kind``'s ``Settings`` made from ``cfg``'s [server] settings; an unknown key, a
    value of the wrong type or out of range is a one-line ``ConfigError``."""
    cls = getattr(kind, "Settings", NoSettings)
    if not dataclasses.is_dataclass(cls):
        raise ConfigError(f"server: {kind.__name__}.Settings is not a dataclass (declare a "
                          f"kind's settings as a frozen @dataclass, docs/strategies.md)")
    hints = get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in cfg.server.settings.items():
        if key not in known:
            raise ConfigError(f"server.{key}: not a setting of server {cfg.server.kind!r} "
                              f"(its settings: {', '.join(known) or 'none'})")
        values[key] = coerce(f"server.{key}", value, hints[key])
    for f in dataclasses.fields(cls):
        if f.name not in values and f.default is f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"server.{f.name}: must be given (server {cfg.server.kind!r} "
                              f"has no default for it)")
    try:
        return cls(**values)
    except ValueError as exc:
        raise ConfigError(first_line(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a plug-in's own __post_init__ that fails
        raise ConfigError(f"server: the settings of {cfg.server.kind!r} failed "
                          f"({type(exc).__name__}: {first_line(exc)})") from None
