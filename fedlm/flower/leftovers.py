"""No Ray process outlives ``fedlm run``: what Flower's simulation starts is waited for.

Ray's shutdown signals its processes (GCS, raylet, the ClientApp actors' workers) and
returns before they have exited. The actor workers are the raylet's children: when
the raylet goes first they are re-parented to init, no longer our descendants, and a
wait on our process tree misses them (CI saw two such workers still alive after an
interrupted run). While the simulation runs this process is a *child subreaper*
(Linux ``prctl(PR_SET_CHILD_SUBREAPER)``), so orphans of Ray's tree come to us
instead; afterwards we wait for every process that appeared under us, bounded, kill
what is still there, and reap the zombies we adopted. Processes that were ours before
(a test's own server, say) are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterator

from fedlm.interrupts import libc_prctl

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_PR_GET_CHILD_SUBREAPER = 37


@contextlib.contextmanager
def none_left_behind(timeout: float = 15.0) -> Iterator[None]:
    """Run the block as a subreaper; then wait (at most ``timeout`` s) for the processes
    that appeared under this one, SIGKILL the rest, and reap them."""
    before = set(descendants())
    was_subreaper = _set_subreaper(True)
    try:
        yield
    finally:
        deadline = time.monotonic() + timeout
        while (left := set(descendants()) - before) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling /proc: exiting processes that are not our children
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not was_subreaper:
            _set_subreaper(False)
        _reap_adopted(before, killed=left)


def descendants() -> list[int]:
    """This process's live (not zombie) descendants, from /proc."""
    parent = {pid: ppid for pid, (state, ppid) in _processes().items() if state != "Z"}
    mine = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, ppid in parent.items() if ppid in mine} - mine
        grew = bool(found)
        mine |= found
    return sorted(mine - {os.getpid()})


def _processes() -> dict[int, tuple[str, int]]:
    """pid -> (state, parent pid) of every process in /proc."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            found[int(entry.name)] = (fields[0], int(fields[1]))
    return found


def _reap_adopted(before: set[int], killed: set[int], timeout: float = 5.0) -> None:
    """Collect our zombie children that were not ours before the block (adopted
    orphans, or Ray's own children it did not wait for). Those of ours just killed
    are waited for (at most ``timeout`` s): SIGKILL takes effect a moment later, and
    on a loaded machine one collected at once was still running, then stayed a
    zombie."""
    me = os.getpid()
    deadline = time.monotonic() + timeout
    while True:
        procs = _processes()
        for pid, (state, ppid) in procs.items():
            if ppid == me and state == "Z" and pid not in before:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        dying = [pid for pid in killed if pid in procs and procs[pid][1] == me
                 and procs[pid][0] != "Z"]
        if not dying or time.monotonic() >= deadline:
            return
        time.sleep(0.01)  # polling /proc until SIGKILL has taken them


def _set_subreaper(on: bool) -> bool:
    """Turn the subreaper flag on or off; returns whether it was on before (False where
    it cannot be set: not Linux)."""
    prctl = libc_prctl()
    if prctl is None:
        return False
    flag = ctypes.c_int(0)
    prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
    return bool(flag.value)
