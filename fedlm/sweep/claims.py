"""Which sweep process trains which cell: claims beside the run store.

Two ``fedlm sweep`` processes on one spec and store (started together, or a second
one while the first runs) would otherwise both train every cell not yet finished:
each reads the store, sees the cell missing, and starts it. A cell is claimed before
its ``fedlm run`` starts by creating a file in ``<db>.claims/`` with ``O_EXCL``: the
file system lets exactly one process create it. The file holds its owner (host, PID,
process start time, ``fedlm.ownership``), and its owner touches it (its mtime, the
claim's heartbeat) every ``ownership.HEARTBEAT_EVERY`` seconds while the cell runs.
A claim is judged as a run's writer is (``ownership.judge``): on the owner's host,
dead the moment its PID is gone; from another host, dead once its heartbeat is
``ownership.STALE_AFTER`` seconds old, and alive until then however long ago it was
taken. A dead owner's claim is taken over; a claim is removed when its cell ends. A
sweep that finds a cell claimed by a live process leaves it to that process and takes
its result from the store once it has finished (``wait_for``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable

from fedlm import files, ownership


def folder_of(db: str | Path) -> Path:
    return Path(f"{db}.claims")


def _path(db: str | Path, name: str) -> Path:
    # a cell's name holds spaces, '@' and an arm's own text: the file is named by its hash
    return folder_of(db) / (hashlib.sha256(name.encode()).hexdigest()[:24] + ".claim")


def _owner_alive(path: Path) -> bool:
    try:
        beat = os.stat(path).st_mtime  # touched by its owner while the cell runs
    except OSError:
        return False  # released meanwhile
    try:
        owner = json.loads(files.read_text(path, "claim"))
    except (OSError, ValueError):  # FileRefused is a ValueError
        owner = None
    if not isinstance(owner, dict):  # being written now (an O_EXCL file is empty at
        # first), or half-written by a process killed at that instant: its age decides
        return time.time() - beat <= ownership.STALE_AFTER
    return ownership.judge(owner.get("host"), owner.get("pid"), owner.get("started"),
                           beat).alive


class Claim:
    """This process's claim on one cell, kept fresh by a heartbeat thread; ``release``
    when the cell is over."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._heartbeat = ownership.Heartbeat(self._beat)

    def _beat(self) -> None:
        # the file this process made, by descriptor: a claim taken over meanwhile (this
        # process judged dead from another host) is the taker's to keep fresh, not ours
        os.utime(self._fd if os.utime in os.supports_fd else self.path)

    def release(self) -> None:
        self._heartbeat.stop()
        try:
            if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:  # not a taker's
                self.path.unlink()
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)


def take(db: str | Path, name: str) -> Claim | None:
    """Claim cell ``name`` for this process, or None if a live process holds it."""
    path = _path(db, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = ownership.current()
    text = json.dumps({"name": name, "host": me.host, "pid": me.pid, "started": me.started,
                       "at": time.time()})
    for _ in range(3):  # a stale claim is removed, then taken like a free one
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _owner_alive(path):
                return None
            try:
                path.unlink()  # its owner is gone: a claim of nobody's
            except FileNotFoundError:
                pass
            continue
        os.write(fd, text.encode())
        return Claim(path, fd)
    return None


def held_elsewhere(db: str | Path, name: str) -> bool:
    """Whether a live process other than this one holds cell ``name``'s claim."""
    path = _path(db, name)
    return path.exists() and _owner_alive(path)


def wait_for(db: str | Path, names: list[str], finished: Callable[[str], bool],
             log=print, poll: float = 2.0) -> list[str]:
    """Wait until every cell of ``names`` has finished in the store or is no longer
    claimed by a live process; return those still not finished (their owner stopped)."""
    waiting = list(names)
    if waiting:
        log(f"waiting for {len(waiting)} cell(s) another sweep is training")
    while waiting:
        waiting = [n for n in waiting if not finished(n) and held_elsewhere(db, n)]
        if waiting:
            time.sleep(poll)  # polling the store and the claims, a bounded wait per look
    return [n for n in names if not finished(n)]
