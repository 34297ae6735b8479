"""What a strategy may declare about itself beyond its hooks, as class attributes, read
in one place (``traits``): the base class (``fedlm.strategies.base.Strategy``) holds
only what every strategy has, its name, its source and its hooks.

    synchronous          rounds with a barrier (``Synchronous``, the base of every
                         strategy of rounds, sets it; default False: asynchronous)
    wants_grace          asynchronous: jobs that finish together should be applied
                         together, so their workers restart from the same model
                         (``grace = "auto"`` then opens the adaptive window)
    default_server       the kind of server a config that names none gets: a kind's
                         name, or a table spelt as ``[server]`` is (HALoS: the region
                         servers with its constants); "" = one, or streamed where
                         ``[stream]`` asks for it
    default_local_steps  the local-steps policy a config that leaves it out gets
                         ("" = the config's "fixed")
    refused_local_steps  policies it refuses: name -> the hint its one-line error gives

A strategy sets only those that differ from the defaults (delayed Nesterov:
``wants_grace = True``); its subclasses inherit them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Traits:
    synchronous: bool = False
    wants_grace: bool = False
    default_server: str | dict = ""
    default_local_steps: str = ""
    refused_local_steps: dict[str, str] = field(default_factory=dict)


def traits(strategy) -> Traits:
    """The traits a strategy class (or instance) declares, the defaults where it does not."""
    cls = strategy if isinstance(strategy, type) else type(strategy)
    return Traits(**{f.name: getattr(cls, f.name) for f in fields(Traits) if hasattr(cls, f.name)})
