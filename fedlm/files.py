"""Reading a file a user pointed fedlm at: a regular file, under a size cap, read once;
and writing fedlm's own cache files whole or not at all (``write_cache``).

Every file fedlm reads on someone's word (configs and sweep specs, traces,
checkpoints and weights, text corpora) goes through ``read_bytes``, so that a FIFO, a
device such as ``/dev/zero``, a directory or a file larger than anything fedlm writes
is refused in one line before a byte is read, instead of blocking forever or reading
until memory runs out. The caps are far above what fedlm itself writes (the largest,
a 150m-parameter run's checkpoint, is a few GB).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fedlm.errors import shown_key
from fedlm.sim.room import for_one_read

MiB = 1 << 20
GiB = 1 << 30

CAPS = {  # bytes fedlm reads of each kind of file, at most
    "config": 16 * MiB,       # a TOML config or sweep spec
    "trace": 512 * MiB,       # a FedScale-format trace (FedScale's own are tens of MB)
    "checkpoint": 64 * GiB,   # a run's checkpoint, the pretraining cache, init.from weights
    "text": 4 * GiB,          # one file of a text corpus (data.source = text:GLOB)
    "claim": 1 * MiB,         # a sweep's claim on a cell
    "owner record": 1 * MiB,  # who owns a worker-state folder (fedlm.worker.state_folders)
    "worker state": 64 * GiB,  # a job's optimizer state (fedlm.worker.states)
}
# Files read whole into memory: their cap is also the memory this process can read
# them into now (``fedlm.sim.room.for_one_read``), not a size no machine here has.
READ_WHOLE = ("checkpoint", "worker state")


class FileRefused(ValueError):
    """Not a file fedlm reads: the message is one line naming the path and why."""


def kind(mode: int) -> str:
    """What a file that is not a regular one is, in words ("a FIFO")."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def shown_size(n: int) -> str:
    """Bytes as people read them: MiB, or GiB from 1 GiB."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def regular(path: str | Path, what: str) -> os.stat_result:
    """``os.stat(path)`` if ``path`` is a regular file; else ``FileRefused`` naming what it
    is. For files fedlm hands to another reader (SQLite opens the run database itself):
    a FIFO or a device would block that open, or feed it for ever. Links are followed (a
    link to a regular file is one)."""
    where = shown_key(str(path))
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FileRefused(f"{where}: cannot read the {what} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{where}: the {what} is {kind(st.st_mode)}, not a regular file")
    return st


def check(path: str | Path, what: str) -> int:
    """The size of ``path`` if it is a regular file within the cap of ``what`` (a key of
    ``CAPS``); else ``FileRefused``. Links are followed (a link to a regular file is one)."""
    where = shown_key(str(path))
    st = regular(path, what)
    if st.st_size > CAPS[what]:
        raise FileRefused(f"{where}: the {what} is {shown_size(st.st_size)}, more than the "
                          f"{shown_size(CAPS[what])} fedlm reads")
    if what in READ_WHOLE:
        room = for_one_read()
        if st.st_size > room:
            raise FileRefused(f"{where}: the {what} is {shown_size(st.st_size)}, more than "
                              f"the {shown_size(room)} of memory this process can read it "
                              f"into now")
    return st.st_size


def read_bytes(path: str | Path, what: str) -> bytes:
    """The bytes of ``path``, checked first (``check``); never more than it held then (a
    file that grows while it is read is refused: it is being written)."""
    size = check(path, what)
    where = shown_key(str(path))
    try:
        # O_NONBLOCK: should the path have become a FIFO since the check, open returns
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise FileRefused(f"{where}: the {what} is not a regular file")
            data = f.read(size)  # what it held when checked
            grown = f.read(1)
    except OSError as exc:
        raise FileRefused(f"{where}: cannot read the {what} ({exc.strerror or exc})") from None
    if grown:
        raise FileRefused(f"{where}: the {what} grew while it was read")
    return data


def read_text(path: str | Path, what: str, errors: str = "strict") -> str:
    """``read_bytes`` decoded as UTF-8."""
    return read_bytes(path, what).decode("utf-8", errors=errors)


def write_cache(path: Path, write) -> None:
    """Write one of fedlm's cache files: ``write(tmp)`` to a temporary file beside
    ``path``, then rename it (concurrent readers never see half a file). A write that
    fails leaves no temporary file behind (a full disk gets no fuller) and names the
    file it was for."""
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not exc.filename:  # say where
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
