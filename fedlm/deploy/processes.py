"""Stopping what a deployment started, whatever it started in turn.

The SuperLink starts its SuperExec (and that the ServerApp) in a session of its own, so
stopping the processes one started (their process groups: SIGTERM, then SIGKILL after a
bound) is not the end of it: they exit once they see the SuperLink gone (0.2 s checks,
then a graceful exit). So the deployment's home is in every process's environment
(``FLWR_HOME``), and what still carries it after a bounded wait is ended by PID (Linux).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

WAIT_S = 15.0  # each stage's bound


def stop_all(procs: list[subprocess.Popen], mark: str) -> None:
    """Stop ``procs`` (newest first: SIGTERM to each group, SIGKILL past ``WAIT_S``), then
    every live process whose environment holds ``mark`` (``NAME=VALUE``)."""
    for proc in reversed(procs):
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    for proc in procs:
        try:
            proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def marked(mark: str) -> list[int]:
    """Live processes (but this one) whose environment holds ``mark`` (Linux; none
    elsewhere)."""
    needle = mark.encode()
    pids = []
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return pids
    for p in proc_dir.iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                if needle in (p / "environ").read_bytes().split(b"\0"):
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids
