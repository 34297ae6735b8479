"""A bound in wall-clock time on each call into a server kind and its strategy: plug-in
code that sleeps, spins or waits on a lock for ever would otherwise hold the run for
ever, and the progress watch, which counts jobs, would never fire.

``HookWatch(limit)`` runs each call of ``ServerCalls`` (``run``, through ``Watched``:
the engine owns the watch and arms it while it runs, ``armed``); a watcher thread,
started with the first call and gone after a few idle seconds, raises ``HookTimeout``
in the calling thread once a call has taken ``limit`` seconds
(``reliability.hook_timeout``; 0: unbounded). In the main thread (the in-process
backend) it is raised through SIGALRM, so that it cuts a sleep or a blocking wait
short; in another thread (Flower's ServerApp) at its next line of Python
(``PyThreadState_SetAsyncExc``: a call blocked inside C finishes first). A call made
inside another is bounded by the outer one. The run then ends failed, with one line
naming the hook. Where a call in another thread does not end at its next line because it
is blocked inside C (a plug-in's ``time.sleep``), the main thread ends the command
instead, ``STUCK_GRACE_S`` later (``fedlm.interrupts.end_main``: Flower's simulation then
stops, and ``fedlm.flower.simulation`` stores how the run ended).

``bounded`` puts the same bound on plug-in code run outside the engine: a config's
strategy constructor, server kind's check, codec or ``inner.optimizer`` factory, loaded
and tried before any run is stored.
"""

from __future__ import annotations

import inspect
import math
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from fedlm import interrupts
from fedlm.config import Config

IDLE_EXIT_S = 5.0  # the watcher thread ends after this long without a call in progress
POLL_S = 0.5  # how often the watcher looks while a call is in progress
STUCK_GRACE_S = 2.0  # after the bound, how long a call in another thread may take to end
MIN_LIMIT = 1.0  # seconds: the shortest bound a config may set (but 0, no bound)
PLUGIN_HINT = "plug-in code that blocks?"
BUILT_IN_HINT = "fedlm's own code: a bound this short cuts ordinary work, raise it"


class HookTimeout(Exception):
    """A call into a server kind or its strategy ran past ``reliability.hook_timeout``."""

    message = "a call into the strategy did not return in time"

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.message


class HookWatch:
    """Bounds each call made through ``run`` to ``limit`` seconds."""

    def __init__(self, limit: float) -> None:
        self.limit = float(limit)
        self._call: tuple[int, str, float, int] | None = None  # token, what, deadline, thread
        self._token = 0
        self._lock = threading.Lock()
        self._watching = False
        self._pending: tuple[int, HookTimeout] | None = None  # (call token, its error)
        self._previous: Any = None
        self._main = threading.main_thread().ident

    def run(self, what: str, fn: Callable, *args, hint: str = PLUGIN_HINT, **kwargs):
        """``fn(*args, **kwargs)``, bounded (``what`` names it in the error, ``hint`` says
        whose code it is)."""
        if self.limit <= 0 or self._call is not None:  # unbounded, or inside a bounded call
            return fn(*args, **kwargs)
        self._token += 1
        self._call = (self._token, f"{what}\0{hint}", time.monotonic() + self.limit,
                      threading.get_ident())
        if not self._watching:
            self._start_watcher()
        try:
            return fn(*args, **kwargs)
        finally:
            self._call = None

    @contextmanager
    def armed(self) -> Iterator[None]:
        """Inside the block, a call of the main thread that runs past the bound is cut
        short by SIGALRM (its handler installed for the block; elsewhere, and outside
        it, the exception is raised at the call's next line of Python)."""
        if self.limit <= 0 or threading.get_ident() != self._main or self._previous is not None:
            yield  # unbounded, another thread, or armed already (a nested ``bounded``)
            return
        self._previous = signal.signal(signal.SIGALRM, self._on_alarm)
        try:
            yield
        finally:
            signal.signal(signal.SIGALRM, self._previous)
            self._previous = None

    def _start_watcher(self) -> None:
        with self._lock:
            if not self._watching:
                self._watching = True
                threading.Thread(target=self._watch, name="fedlm-hook-watch",
                                 daemon=True).start()

    def _watch(self) -> None:
        idle_since = time.monotonic()
        while True:
            call, now = self._call, time.monotonic()
            if call is None:
                if now - idle_since > IDLE_EXIT_S:
                    with self._lock:
                        if self._call is None:
                            self._watching = False
                            return
                time.sleep(POLL_S)
                continue
            idle_since = now
            if now < call[2]:
                time.sleep(min(POLL_S, call[2] - now))
            else:
                text = self._fire(call)
                stuck_at = time.monotonic() + STUCK_GRACE_S
                while self._call is call:  # until the call is gone (raised, or returned)
                    if call[3] != self._main and time.monotonic() > stuck_at:
                        interrupts.end_main(HookTimeout(f"{text}; the call is blocked "
                                                        f"inside C, the run ends without it"))
                        stuck_at = float("inf")  # once
                    time.sleep(0.05)

    def _fire(self, call: tuple[int, str, float, int]) -> str:
        token, named, _, thread = call
        what, hint = named.split("\0")
        text = f"{what} did not return within {self.limit:g} s (reliability.hook_timeout; {hint})"
        if thread == self._main and self._previous is not None:
            self._pending = (token, HookTimeout(text))
            signal.pthread_kill(thread, signal.SIGALRM)  # _on_alarm raises it there
        else:
            interrupts.raise_in(thread, type("HookTimeout", (HookTimeout,), {"message": text}))
        return text

    def _on_alarm(self, signum, frame) -> None:
        pending, self._pending = self._pending, None
        call = self._call
        if pending is not None and call is not None and call[0] == pending[0]:
            raise pending[1]  # only in the call that ran over, not one begun since
        if pending is None and callable(self._previous):  # not ours: whose it was (a timer)
            self._previous(signum, frame)


class Watched:
    """``server`` with each of its methods run through ``watch`` (its other attributes
    read as they are)."""

    def __init__(self, server: Any, watch: HookWatch) -> None:
        self._target, self._watch = server, watch

    def __getattr__(self, name: str):
        value = getattr(self._target, name)
        if not inspect.ismethod(value):
            return value  # a field: read afresh every time
        strategy = getattr(self._target, "strategy", None)
        what = (f"{type(self._target).__name__}.{name}"
                + (f" (strategy {type(strategy).__name__})" if strategy is not None else ""))
        hint = PLUGIN_HINT if _plug_in(self._target) or _plug_in(strategy) else BUILT_IN_HINT
        run = self._watch.run

        def bounded(*args, **kwargs):
            return run(what, value, *args, hint=hint, **kwargs)

        setattr(self, name, bounded)  # a method: wrapped once, found directly after
        return bounded


def _plug_in(obj: Any) -> bool:
    """Whether ``obj``'s class is someone else's code (a plug-in's strategy or server
    kind, which may subclass fedlm's; fedlm's own never subclass a plug-in's)."""
    return obj is not None and not type(obj).__module__.startswith("fedlm.")


def plug_in_bound(cfg: Config) -> float:
    """Seconds plug-in code run for ``cfg`` before its run may take: its
    ``reliability.hook_timeout`` (0: no bound), or the default where that is not a bound
    a config may set (its checks then refuse it)."""
    limit = cfg.reliability.hook_timeout
    ok = isinstance(limit, (int, float)) and math.isfinite(limit) and (
        limit == 0 or limit >= MIN_LIMIT)
    return float(limit) if ok else Config().reliability.hook_timeout


# ``bounded``'s watches, one per bound: a sweep loads hundreds of configs, and a watch
# of its own for each would leave as many watcher threads (each idle ``IDLE_EXIT_S``).
_WATCHES: dict[float, HookWatch] = {}


def bounded(limit: float, what: str, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` bounded as a hook is (``limit`` seconds, 0: no bound): for
    plug-in code run outside the engine, a config's strategy constructor and the rest,
    loaded and tried before a run is stored. Past the bound, a one-line ``ConfigError``
    naming ``what``."""
    from fedlm.errors import ConfigError

    watch = _WATCHES.setdefault(limit, HookWatch(limit))  # one watcher thread per bound
    try:
        with watch.armed():
            return watch.run(what, fn, *args, **kwargs)
    except HookTimeout as exc:
        raise ConfigError(f"reliability.hook_timeout: {exc}") from None
