"""How a long command stops when it is told to (Ctrl-C, SIGTERM, SIGHUP): cleanly,
once, with nothing it started left behind.

Three ways, one per kind of work:

- ``stop_on_signals``: a run asks its engine to stop (``Stop``); the engine
  ends at its next step, the run is kept and marked interrupted; one that does not
  within ``STOP_GRACE_S`` (or at a second signal) is made to;
- ``interrupt_on_signals``: SIGTERM and SIGHUP raise ``KeyboardInterrupt`` as
  Ctrl-C does, so that the ``finally`` blocks on the way out (a deployment's
  processes) run; a second signal while they run is ignored rather than cutting
  them short;
- ``serve``: a server in a child process runs until it ends or we are told to
  stop; then it and everything it started are stopped (SIGTERM, SIGKILL after a
  grace period); if we are killed outright (SIGKILL), it gets SIGTERM from the
  kernel (Linux).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@contextmanager
def _handled(signals: tuple[int, ...], handler) -> Iterator[None]:
    """``handler`` for ``signals`` inside the block; the previous handlers after it."""
    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


STOP_GRACE_S = 10.0  # how long a run has to stop at its next step before it is made to


class Stop:
    """A run's stop request: ``is_set`` is the engine's ``should_stop``. It also notes
    the thread that asks (the engine's: the main thread in process, the ServerApp's
    on Flower), which is where a stop that is overdue is raised."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.asker: int | None = None  # ident of the thread that last asked
        self.forced = False  # the stop was overdue and raised (``stop_on_signals``)

    def is_set(self) -> bool:
        self.asker = threading.get_ident()
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()


@contextmanager
def stop_on_signals(on_first: Callable[[], None] = lambda: None,
                    overdue: type[BaseException] = KeyboardInterrupt,
                    grace: float = STOP_GRACE_S) -> Iterator[Stop]:
    """SIGINT and SIGTERM set the yielded ``Stop`` (the engine's ``should_stop``)
    instead of raising: the run then ends at its next step, its store consistent.
    ``on_first`` is called on the first signal only (to say that it is stopping).

    A run that has not stopped ``grace`` seconds later, or a second signal, raises
    ``overdue`` in the engine's thread, whatever it is doing (a plug-in that spins or
    sleeps, a loop that never reaches its next step): in the main thread through the
    signal handler (which also cuts a sleep short), in another thread at its next
    line of Python (``PyThreadState_SetAsyncExc``); and where that thread is blocked
    inside C (a plug-in's sleep), ``grace`` seconds later still in the main thread, so
    that the command ends whatever the engine's thread is doing."""
    stop, lock = Stop(), threading.Lock()
    live = {"active": True, "main": False}  # forced: stop.forced
    main = threading.main_thread().ident

    def force() -> None:
        with lock:  # never after the block: another handler may be back by then
            if not live["active"] or stop.forced:
                return
            stop.forced = True
            target = stop.asker or main
            if target == main:
                signal.pthread_kill(main, signal.SIGINT)  # on_signal raises, below
            else:
                raise_in(target, overdue)
                last.start()

    def force_main() -> None:
        # the engine's thread is blocked inside C (a plug-in's sleep): the command ends
        # from its main thread instead (the run then reads as crashed)
        with lock:
            if live["active"]:
                live["main"] = True
                signal.pthread_kill(main, signal.SIGINT)

    timer = threading.Timer(grace, force)
    last = threading.Timer(grace, force_main)
    timer.daemon = last.daemon = True

    def on_signal(signum, frame) -> None:
        if _ENDING and threading.get_ident() == main:  # end_main: the run's own end
            raise _ENDING[0]
        if stop.forced and threading.get_ident() == main and (
                (stop.asker or main) == main or live["main"]):
            raise overdue()
        if stop._event.is_set():  # a second signal: now
            threading.Thread(target=force, daemon=True).start()
            return
        on_first()
        stop.set()
        timer.start()

    with _handled((signal.SIGINT, signal.SIGTERM), on_signal):
        try:
            yield stop
        finally:
            with lock:
                live["active"] = False
            timer.cancel()
            last.cancel()


def exit_if_stuck(status: int, say: bool = True) -> None:
    """After a forced stop: a thread of the run still blocked inside C (a plug-in's
    sleep) would hold the interpreter at exit for ever; end the process now instead
    (``say``: print which thread, where no line has said so yet)."""
    stuck = [t for t in threading.enumerate()
             if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if stuck:
        if say:
            print(f"fedlm: {stuck[0].name} is still blocked (plug-in code?): exiting "
                  f"without waiting for it", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


# What the main thread is to raise, set by ``end_main`` (one at a time; taken back by
# ``take_ending`` once the command has dealt with it).
_ENDING: list[BaseException] = []


def end_main(exc: BaseException) -> None:
    """Have the main thread raise ``exc`` now: for a run whose engine thread is blocked
    inside C (a plug-in's sleep), which no exception of its own can reach. The main
    thread's SIGINT handler raises it (``stop_on_signals``'), or Python's default one a
    ``KeyboardInterrupt`` (``take_ending`` then says what it stood for)."""
    _ENDING[:] = [exc]
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def take_ending() -> BaseException | None:
    """What ``end_main`` had the main thread raise, if it did; forgotten once taken."""
    return _ENDING.pop() if _ENDING else None


def raise_in(thread_id: int, exc_type: type[BaseException]) -> None:
    """Raise ``exc_type`` in thread ``thread_id`` at its next line of Python."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exc_type))


@contextmanager
def interrupt_on_signals() -> Iterator[threading.Event]:
    """SIGINT, SIGTERM and SIGHUP raise ``KeyboardInterrupt`` once; the yielded
    ``Event`` says whether one came. Later signals are ignored until the block ends,
    so that what the interrupt cleans up (bounded) is not cut short."""
    received = threading.Event()

    def on_signal(signum, frame) -> None:
        if not received.is_set():
            received.set()
            raise KeyboardInterrupt

    with _handled(_STOP_SIGNALS, on_signal):
        yield received


def serve(cmd: list[str], grace: float = 10.0) -> int:
    """Run the server ``cmd`` until it ends or we are told to stop (Ctrl-C, SIGTERM,
    SIGHUP); then stop it and everything it started (its own process group:
    SIGTERM, SIGKILL after ``grace`` seconds), so nothing outlives the command.
    Returns its exit status, or 0 when we stopped it."""
    with interrupt_on_signals() as stopping:
        proc = subprocess.Popen(cmd, start_new_session=True,  # a group of its own to end
                                preexec_fn=dies_with(os.getpid()))
        try:
            return proc.wait()
        except KeyboardInterrupt:
            return 0
        finally:
            if proc.poll() is None or stopping.is_set():
                _stop_group(proc, grace)


def libc_prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux process controls), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def dies_with(parent: int, sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """For ``Popen``'s ``preexec_fn``: the child gets ``sig`` when ``parent`` dies, even
    by SIGKILL, when no ``finally`` of ours runs to stop it (else a server would go on
    holding its port, a sweep's run on training). Linux only (``prctl(PR_SET_PDEATHSIG)``,
    kept across ``exec``); None elsewhere. The "parent" is the thread that forks: call
    ``Popen`` from a thread that outlives the child (one that waits for it). libc is
    looked up here, before the fork: the child only calls it."""
    prctl = libc_prctl()
    if prctl is None:
        return None

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # it died before that took hold
            os.kill(os.getpid(), sig)

    return in_child


def _stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL if it is not gone after ``grace``
    seconds; then SIGKILL to whatever of its group is left once it has gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
