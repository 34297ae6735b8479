"""Every change fedlm makes to Flower's or Ray's own behaviour, in one place.

Flower and Ray have no setting for a few things fedlm needs (docs/deployment.md
says why, with measurements and the upstream issues). Each such change is a
*patch* here, and every patch

* is applied only when the code that needs it calls it (``supernode_waits()``,
  ``pull_backoff()``, ``ray_keeps_sigterm()``, ``owner_token()``): importing this
  module, or any of fedlm's, changes nothing;
* checks first that the installed version is one it was tested with (``TESTED``)
  and that what it replaces is still what Flower or Ray defines there; on another
  version it refuses with a one-line ``UnsupportedVersion`` naming its switch;
* is idempotent: a second call finds its mark on the replaced object and changes
  nothing (the mark lives on Flower's or Ray's objects, so it holds even where
  fedlm itself is imported twice, as in the warm executor);
* has one switch, ``FEDLM_PATCH_<NAME>=0``, that leaves Flower or Ray as they are;
* says what it changed: the returned ``Patched`` (its ``describe()`` is one line,
  also logged on the ``fedlm`` logger), which can ``undo()`` it (tests).

The warm ClientApp executor (``fedlm.deploy.warm_executor``) is no patch, but it
stands in for Flower's SuperExec with Flower's internals (``run_clientapp``'s
helpers, the Runtime API client): it goes through ``check_supported`` and
``superexec_auth_methods`` here, with the same kind of switch.
"""

from __future__ import annotations

import functools
import hmac
import importlib
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

log = logging.getLogger("fedlm")

# The versions every patch was tested with (the Flower and Ray tests pass on them;
# pyproject pins flwr 1.42, and 1.41.0 passes them too).
TESTED = {"flwr": ("1.41.0", "1.42.0"), "ray": ("2.55.1",)}
PREFIX = "FEDLM_PATCH_"
MARK = "_fedlm_patch"  # attribute set on what a patch puts in place


@dataclass(frozen=True)
class Patch:
    name: str  # "supernode-waits": its switch is FEDLM_PATCH_SUPERNODE_WAITS
    package: str  # "flwr" or "ray": whose version is checked
    what: str  # one line, for messages and docs

    @property
    def switch(self) -> str:
        return PREFIX + self.name.upper().replace("-", "_")


PATCHES = {p.name: p for p in [
    Patch("supernode-waits", "flwr", "the SuperNode's hard-coded 3 s sleep after an empty "
          "poll capped at FEDLM_PATCH_SUPERNODE_WAITS_S (0.25 s), its 0.5 s waits at 0.05 s"),
    Patch("pull-backoff", "flwr", "object pulls retried after 20 ms doubling to 0.25 s, "
          "not 1 s doubling to 10 s"),
    Patch("ray-sigterm", "ray", "ray.init leaves the process's SIGTERM handler alone"),
    Patch("warm-executor", "flwr", "SuperNodes run their ClientApps in one warm executor "
          "process (fedlm.deploy.warm_executor), not Flower's SuperExec"),
    Patch("owner-token", "flwr", "the SuperLink's Control API accepts only requests that "
          "carry the deployment's owner token, not everyone's"),
]}
# the names these settings had before they were gathered here
RENAMED = {"FEDLM_SUPERNODE_POLL_S": "FEDLM_PATCH_SUPERNODE_WAITS_S",
           "FEDLM_FLOWER_PULL_BACKOFF": "FEDLM_PATCH_PULL_BACKOFF",
           "FEDLM_WARM_EXECUTOR": "FEDLM_PATCH_WARM_EXECUTOR",
           "FEDLM_WARM_POLL_S": "FEDLM_PATCH_WARM_EXECUTOR_POLL_S"}


class UnsupportedVersion(RuntimeError):
    """A patch met a Flower or Ray version (or internals) it was not tested with."""


def installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "none"


def enabled(name: str, env=None) -> bool:
    """Whether patch ``name`` is on (``FEDLM_PATCH_<NAME>`` is not "0")."""
    env = os.environ if env is None else env
    for old, new in RENAMED.items():
        if old in env and new not in env:
            warnings.warn(f"{old} is no longer read; it is now {new}", stacklevel=2)
    return env.get(PATCHES[name].switch, "1") != "0"


def check_supported(name: str) -> None:
    """Refuse (``UnsupportedVersion``) when patch ``name``'s package is not a tested version."""
    patch = PATCHES[name]
    have, tested = installed(patch.package), TESTED[patch.package]
    if have not in tested:
        raise UnsupportedVersion(
            f"fedlm's {name} patch ({patch.what}) is tested with {patch.package} "
            f"{', '.join(tested)}, not {have}: set {patch.switch}=0 to run without it")


def setting(name: str, default: float) -> float:
    """A number for a patch, ``FEDLM_PATCH_<NAME>`` (e.g. ``..._WAITS_S``)."""
    return float(os.environ.get(PREFIX + name, default))


@dataclass
class Patched:
    """What one call of a patch did: ``changed`` names each "module.attribute" it
    replaced (empty: switched off, or already in place)."""

    name: str
    changed: list[str] = field(default_factory=list)
    note: str = ""  # "off", "already applied", or what it did
    _undo: list[tuple[object, str, object]] = field(default_factory=list, repr=False)

    def describe(self) -> str:
        where = f": {', '.join(self.changed)}" if self.changed else ""
        return f"fedlm patch {self.name} ({self.note}){where}"

    def undo(self) -> None:
        for obj, attr, original in reversed(self._undo):
            setattr(obj, attr, original)
        self._undo.clear()


def _start(name: str) -> Patched | None:
    """None: go on and patch; a Patched: the switch is off."""
    if not enabled(name):
        off = Patched(name, note=f"off: {PATCHES[name].switch}=0")
        log.info("%s", off.describe())
        return off
    check_supported(name)
    return None


def _replace(done: Patched, obj, attr: str, new, where: str) -> None:
    setattr(new, MARK, done.name)
    done._undo.append((obj, attr, getattr(obj, attr)))
    setattr(obj, attr, new)
    done.changed.append(where)


def _report(done: Patched, applied: str) -> Patched:
    done.note = applied if done.changed else "already applied"
    log.info("%s", done.describe())
    return done


# -- supernode-waits: flwr.supernode.start_client_internal ---------------------------
LOCAL_WAIT_S = 0.05


class _ShortWaits:
    """Stands in for the ``time`` module inside Flower's SuperNode loop (which only
    calls ``time.sleep`` on it): sleeps of 3 s or more (after an empty poll of the
    SuperLink) capped at ``empty_poll_s``, shorter ones (local checks) at 0.05 s."""

    def __init__(self, empty_poll_s: float) -> None:
        self.empty_poll_s = empty_poll_s

    def __getattr__(self, name: str):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.empty_poll_s if seconds >= 3 else LOCAL_WAIT_S))


def supernode_waits() -> Patched:
    """Flower's SuperNode loop sleeps a hard-coded 3 s after a poll that found no
    message and 0.5 s between local checks; cap them (this process only)."""
    if (off := _start("supernode-waits")) is not None:
        return off
    from flwr.supernode import start_client_internal as loop

    done = Patched("supernode-waits")
    current = getattr(loop, "time")
    if getattr(current, MARK, None) != done.name:
        if current is not time:
            raise UnsupportedVersion(f"{loop.__name__}.time is not the time module; "
                                     f"the Flower internals changed: set "
                                     f"{PATCHES['supernode-waits'].switch}=0")
        waits = _ShortWaits(setting("SUPERNODE_WAITS_S", 0.25))
        _replace(done, loop, "time", waits, f"{loop.__name__}.time")
        return _report(done, f"empty poll {waits.empty_poll_s:g} s, local waits "
                             f"{LOCAL_WAIT_S:g} s")
    return _report(done, "")


# -- pull-backoff: who imported Flower's pull functions ------------------------------
INITIAL_BACKOFF_S = 0.02
BACKOFF_CAP_S = 0.25
# module -> the names in it that Flower's pull functions were imported as
PULL_TARGETS = {
    "flwr.supernode.start_client_internal": ("pull_objects",),
    "flwr.supernode.runtime.run_clientapp": ("pull_and_inflate_object_from_tree",),
    "flwr.superlink.grid.http_grid": ("pull_objects",),
}


def pull_backoff(*modules: str) -> Patched:
    """Rebind Flower's object-pull functions in ``modules`` (of ``PULL_TARGETS``; none:
    all) to retry a missing object after 20 ms doubling to 0.25 s instead of 1 s
    doubling to 10 s. The bound on a pull stays Flower's ``PULL_MAX_TIME``."""
    if (off := _start("pull-backoff")) is not None:
        return off
    from flwr.supercore.inflatable import inflatable_utils as utils

    done = Patched("pull-backoff")
    for name in modules or PULL_TARGETS:
        module = importlib.import_module(name)
        for attr in PULL_TARGETS[name]:
            current = getattr(module, attr)
            if getattr(current, MARK, None) == done.name:
                continue
            original = getattr(utils, attr)
            if current is not original:
                raise UnsupportedVersion(
                    f"{name}.{attr} is not Flower's {utils.__name__}.{attr}; the Flower "
                    f"internals changed: set {PATCHES['pull-backoff'].switch}=0")
            short = functools.partial(original, initial_backoff=INITIAL_BACKOFF_S,
                                      backoff_cap=BACKOFF_CAP_S, max_tries_per_object=None)
            _replace(done, module, attr, short, f"{name}.{attr}")
    return _report(done, f"retry after {INITIAL_BACKOFF_S:g} s up to {BACKOFF_CAP_S:g} s")


# -- ray-sigterm: ray._private.utils.set_sigterm_handler -----------------------------
def _keep_sigterm(sigterm_handler) -> None:
    """Ray's ``set_sigterm_handler``, doing nothing: the process keeps its handler."""


def ray_keeps_sigterm() -> Patched:
    """``ray.init`` (inside ``run_simulation``) replaces the process's SIGTERM handler
    with one that exits at once, leaving a run marked "running"; keep fedlm's, which
    stops the engine so that ``run_simulation`` shuts Ray down as on a normal end.
    Process-wide: call it only in a process that runs the simulation engine."""
    if (off := _start("ray-sigterm")) is not None:
        return off
    import ray._private.utils as utils

    done = Patched("ray-sigterm")
    current = getattr(utils, "set_sigterm_handler", None)
    if getattr(current, MARK, None) != done.name:
        if getattr(current, "__name__", None) != "set_sigterm_handler":
            raise UnsupportedVersion(f"{utils.__name__}.set_sigterm_handler is not Ray's; "
                                     f"set {PATCHES['ray-sigterm'].switch}=0")
        _replace(done, utils, "set_sigterm_handler", functools.wraps(current)(_keep_sigterm),
                 f"{utils.__name__}.set_sigterm_handler")
    return _report(done, "a no-op")


# -- warm-executor: the private name fedlm's executor reads --------------------------
def superexec_auth_methods() -> frozenset:
    """The Runtime API methods a SuperNode wants signed with the SuperExec secret
    (Flower keeps the list private, in ``run_superexec``)."""
    check_supported("warm-executor")
    from flwr.supercore.superexec import run_superexec

    methods = getattr(run_superexec, "_SUPEREXEC_AUTH_METHODS", None)
    if not methods:
        raise UnsupportedVersion(f"{run_superexec.__name__}._SUPEREXEC_AUTH_METHODS is gone; "
                                 f"set {PATCHES['warm-executor'].switch}=0")
    return frozenset(methods)


# -- Ray's cluster lookup: read, not changed --------------------------------------------
def ray_head_address(address: str) -> str | None:
    """``HOST:PORT`` of the Ray head that ``sim.ray_address`` names, found as ``ray.init``
    finds it (``auto``: RAY_ADDRESS, then the cluster ``ray start`` left on this host;
    ``localhost`` as the node's address); None where no cluster is found. Ray keeps
    this lookup private (``ray._private.services``)."""
    from ray._private import services

    try:
        return services.canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError):  # auto: no cluster on this host
        return None


# -- owner-token: the SuperLink's Control API authentication plugin ------------------
# the modules that imported Flower's loader by name: the SuperLink command, and the
# FastAPI app (which calls it when made without a config)
AUTHN_TARGETS = ("flwr.superlink.cli.flower_superlink", "flwr.superlink.main")
OWNER_AUTHN_TYPE = "fedlm-owner-token"  # what the SuperLink answers `flwr login`


def _owner_authn(token: str):
    """A Control API authentication plugin that admits a request only if its bearer
    token is ``token``; Flower answers every other one 401 (its own error)."""
    from flwr.common.constant import ACCESS_TOKEN_KEY, NOOP_ACCOUNT_NAME, NOOP_FLWR_AID
    from flwr.supercore.auth.typing import AccountAuthLoginDetails, AccountInfo
    from flwr.superlink.auth_plugin import ControlAuthnPlugin

    expected = token.encode()

    class OwnerTokenAuthn(ControlAuthnPlugin):
        def __init__(self) -> None:
            pass

        def get_login_details(self):
            # `flwr login` has no plugin for it: "Unknown account authentication
            # type: fedlm-owner-token" (Flower's words) tells a stranger what stops them
            return AccountAuthLoginDetails(authn_type=OWNER_AUTHN_TYPE, device_code="",
                                           verification_uri_complete="", expires_in=0,
                                           interval=0)

        def validate_tokens_in_metadata(self, metadata):
            given = [v for k, v in metadata if k == ACCESS_TOKEN_KEY]
            if len(given) != 1:
                return False, None
            value = given[0].encode() if isinstance(given[0], str) else given[0]
            if not hmac.compare_digest(value, expected):
                return False, None
            # Flower's single open-source account: the federation checks expect it
            return True, AccountInfo(flwr_aid=NOOP_FLWR_AID, account_name=NOOP_ACCOUNT_NAME)

        def get_auth_tokens(self, device_code):
            return None  # no token is ever handed out: it is only read from the owner's file

        def refresh_tokens(self, metadata):
            return None, None  # the owner's token does not expire; nothing to refresh

    return OwnerTokenAuthn()


def owner_token(token: str) -> Patched:
    """Make the SuperLink started in this process authenticate Control API requests
    (run, stop, list, register a node...) against ``token``: Flower's open-source
    plugin admits everyone, its OIDC one is not in this distribution. Call it before
    ``flower_superlink()``; process-wide."""
    if (off := _start("owner-token")) is not None:
        return off
    if len(token) < 32:
        raise ValueError("owner token: at least 32 characters")
    from flwr.superlink import config_loader

    done = Patched("owner-token")
    modules = [importlib.import_module(name) for name in AUTHN_TARGETS]
    todo = [m for m in modules if getattr(m.load_control_authn_plugin, MARK, None) != done.name]
    for module in todo:  # all checked before any is replaced
        if module.load_control_authn_plugin is not config_loader.load_control_authn_plugin:
            raise UnsupportedVersion(
                f"{module.__name__}.load_control_authn_plugin is not Flower's; the Flower "
                f"internals changed: set {PATCHES['owner-token'].switch}=0")
    plugin = _owner_authn(token)
    for module in todo:
        def load_owner_authn(plugin=plugin):
            return plugin

        _replace(done, module, "load_control_authn_plugin", load_owner_authn,
                 f"{module.__name__}.load_control_authn_plugin")
    return _report(done, "Control API requests need the owner token")
