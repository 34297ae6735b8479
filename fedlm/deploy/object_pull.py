"""Shorter retries of Flower's object pulls: ``shorten_object_pull_backoff()``.

Flower 1.41 sends a message as an object tree: the message is announced first
and its objects (array chunks of up to 5 MB) follow. Whoever pulls it
(``flwr.supercore.inflatable.inflatable_utils.pull_objects``) asks for each
object and, when one is not there yet (``ObjectUnavailableError``), waits
``PULL_INITIAL_BACKOFF`` = 1 s (+-20 %), doubling up to ``PULL_BACKOFF_CAP`` =
10 s, before asking again. No setting changes that. On loopback the objects
are usually a fraction of a second behind the announcement, so a pull that
starts early waits a whole second or three for data that arrived long before:

* the ClientApp (here the warm executor) pulls the message from its SuperNode
  while the SuperNode is still pulling the objects from the SuperLink (the
  SuperNode creates the task before it pulls the objects);
* the ServerApp pulls a reply from the SuperLink while the SuperNode is still
  pushing the reply's objects;
* the SuperNode pulls a message whose objects the ServerApp is still pushing.

This module rebinds ``pull_objects`` / ``pull_and_inflate_object_from_tree``
where Flower's SuperNode loop, ``run_clientapp`` and the ServerApp's HTTP grid
imported them, with ``INITIAL_BACKOFF_S`` = 0.02 s doubling up to
``BACKOFF_CAP_S`` = 0.25 s, in the calling process only. The bound on a pull
stays Flower's ``PULL_MAX_TIME`` (2 h; the tries per object are not counted,
as they would run out 40 times sooner). ``FEDLM_FLOWER_PULL_BACKOFF=0``
leaves Flower's values. See docs/deployment.md ("Per-message overhead") for
the measurement and the upstream issue.
"""

from __future__ import annotations

import functools
import importlib
import os

import flwr

INITIAL_BACKOFF_S = 0.02
BACKOFF_CAP_S = 0.25
ENV_SWITCH = "FEDLM_FLOWER_PULL_BACKOFF"
FLWR_SERIES = "1.41."
# module -> the names in it that Flower's pull functions were imported as
TARGETS = {
    "flwr.supernode.start_client_internal": ("pull_objects",),
    "flwr.supernode.runtime.run_clientapp": ("pull_and_inflate_object_from_tree",),
    "flwr.superlink.grid.http_grid": ("pull_objects",),
}


def shorten_object_pull_backoff(*modules: str) -> list[str]:
    """Rebind the pull functions in ``modules`` (default: all of ``TARGETS``),
    importing them; returns the names rebound ("module.name")."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return []
    if not flwr.__version__.startswith(FLWR_SERIES):
        raise RuntimeError(
            f"fedlm.deploy.object_pull rebinds Flower {FLWR_SERIES}x internals; flwr "
            f"{flwr.__version__} is installed (set {ENV_SWITCH}=0 or port this module)")
    from flwr.supercore.inflatable import inflatable_utils as utils

    done = []
    for name in modules or TARGETS:
        module = importlib.import_module(name)
        for attr in TARGETS[name]:
            current = getattr(module, attr)
            if getattr(current, "_fedlm_short_backoff", False):
                continue
            original = getattr(utils, attr)
            if current is not original:
                raise RuntimeError(f"{name}.{attr} is not Flower's {utils.__name__}.{attr}; "
                                   f"the Flower internals changed")
            short = functools.partial(original, initial_backoff=INITIAL_BACKOFF_S,
                                      backoff_cap=BACKOFF_CAP_S, max_tries_per_object=None)
            short._fedlm_short_backoff = True
            setattr(module, attr, short)
            done.append(f"{name}.{attr}")
    return done
