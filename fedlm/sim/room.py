"""How much memory this machine, and one process on it, can still give: read before a run
starts (``fedlm.sim.memory``) and before a file is read whole (``fedlm.files``).
Standard library only.
"""

from __future__ import annotations

import os

UNKNOWN = 1 << 62  # bytes, when a limit cannot be read: nothing is refused for it
# The address space a run's process takes beside its data: Python, torch and their
# libraries (0.65 GB measured after the imports), and its threads' stacks and malloc
# arenas. What a process limit (``ulimit -v``) leaves for data is its limit less this.
PROCESS_ADDRESS_SPACE = 1 << 30


def available() -> int:
    """Bytes of memory this machine can give a new run now: ``MemAvailable`` (Linux),
    else all of its physical memory; less where this process's control group (a
    container's limit) leaves less."""
    have = _meminfo_available()
    return min(have, _cgroup_room())


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return UNKNOWN


def _cgroup_room() -> int:
    """What this process's control group lets it use beyond what it uses now (cgroup v2's
    ``memory.max``, or v1's ``memory.limit_in_bytes``), or ``UNKNOWN``."""
    for limit, used in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                        ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                         "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as f:
                text = f.read().strip()
            if text == "max":
                return UNKNOWN
            with open(used) as f:
                return max(0, int(text) - int(f.read().strip()))
        except (OSError, ValueError):
            continue
    return UNKNOWN


def process_room() -> int:
    """Bytes one process of the run may still allocate under its resource limits
    (``ulimit -v``: RLIMIT_AS; ``ulimit -d``: RLIMIT_DATA), or ``UNKNOWN``. A job's
    batches are made in one process, so a limit there fails the job however much memory
    the machine has."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return UNKNOWN
    room = UNKNOWN
    for which in (resource.RLIMIT_AS, getattr(resource, "RLIMIT_DATA", None)):
        if which is None:
            continue
        soft, _hard = resource.getrlimit(which)
        if soft != resource.RLIM_INFINITY:
            room = min(room, max(0, soft - PROCESS_ADDRESS_SPACE))
    return room


def for_one_read() -> int:
    """Bytes one process can read a whole file into now: the least of ``available`` and
    ``process_room``."""
    return min(available(), process_room())
