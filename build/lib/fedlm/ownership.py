"""Who writes a run, and whether that writer is still alive.

A run in the store is owned by the process that writes it: its host name, PID
and process start time are stored with the run, and a heartbeat thread
refreshes ``runs.heartbeat_at`` every ``HEARTBEAT_EVERY`` seconds while it
writes. A reader judges a ``running`` run by its owner:

- on the owner's own host, the process table answers at once: the PID is gone,
  or now belongs to a process that started at another time (a reused PID),
  and the run is ``crashed`` the moment its writer was SIGKILLed;
- from another host, only the heartbeat can tell: silent for ``STALE_AFTER``
  seconds means ``crashed``.

``fedlm run --resume`` refuses a run whose owner is alive (two writers on one
run break its operation log) and takes over one whose owner is gone.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

HEARTBEAT_EVERY = 2.0  # seconds between heartbeats of a live writer
STALE_AFTER = 30.0  # a writer on another host silent this long is taken for dead


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    started: float  # the process's start time (s since the epoch), against PID reuse


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def process_start(pid: int) -> float | None:
    """When process ``pid`` started (s since the epoch, rounded to 0.1 s), or None
    where the process table cannot say (no such process, or no /proc)."""
    boot = _boot_time()
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    if boot is None:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[19])  # field 22, starttime, in clock ticks since boot
    return round(boot + ticks / os.sysconf("SC_CLK_TCK"), 1)


def current() -> Owner:
    pid = os.getpid()
    return Owner(socket.gethostname(), pid, process_start(pid) or time.time())


def pid_alive(pid: int, started: float | None) -> bool | None:
    """Is process ``pid`` (started at ``started``) running on this host? None: unknown."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, someone else's
    except OSError:
        return None
    if not os.path.exists("/proc/self/stat"):
        return True  # no process table to read: it exists, reused or not
    now_started = process_start(pid)
    if now_started is None:
        return False  # it exited a moment ago
    if started is not None and abs(now_started - started) > 1.0:
        return False  # the PID was reused by a later process
    try:  # a zombie (killed, not yet reaped by its parent) writes nothing more
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] != "Z"
    except OSError:
        return False


@dataclass(frozen=True)
class Liveness:
    alive: bool
    last_seen: float | None  # the last heartbeat (s since the epoch)
    why: str  # how it was judged, for messages


def judge(host: str | None, pid: int | None, started: float | None,
          heartbeat_at: float | None, now: float | None = None) -> Liveness:
    """Is the writer of a ``running`` run alive? (See the module docstring.)"""
    now = time.time() if now is None else now
    if pid is None or host is None:
        return Liveness(False, heartbeat_at, "no writer recorded")
    if host == socket.gethostname():
        alive = pid_alive(pid, started)
        if alive is not None:
            return Liveness(alive, heartbeat_at,
                            f"pid {pid} {'is running' if alive else 'is gone'} on {host}")
    silent = now - heartbeat_at if heartbeat_at is not None else float("inf")
    alive = silent <= STALE_AFTER
    return Liveness(alive, heartbeat_at,
                    f"pid {pid} on {host}, last heartbeat {silent:.0f} s ago")


class Heartbeat:
    """Calls ``beat()`` every ``HEARTBEAT_EVERY`` seconds on a daemon thread until
    stopped. A beat that fails (the store busy for a moment) is tried at the next."""

    def __init__(self, beat: Callable[[], None], every: float | None = None) -> None:
        self._beat, self._every = beat, every or HEARTBEAT_EVERY
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fedlm-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._beat()
            except Exception:  # noqa: BLE001  (the next beat tries again)
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
