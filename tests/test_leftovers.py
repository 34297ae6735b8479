"""``fedlm.flower.leftovers``: what a Flower simulation starts does not outlive it,
even a process orphaned inside it (Ray's actor workers once the raylet has gone)."""

import os
import subprocess
import sys
import time

from fedlm.flower.leftovers import descendants, none_left_behind

# A child that starts a sleeper and exits at once: the sleeper is orphaned.
ORPHANER = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(120)']); print(p.pid, flush=True)")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_orphan_made_inside_is_adopted_stopped_and_reaped():
    keep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        started = time.monotonic()
        with none_left_behind(timeout=1.0):
            # (the sleeper holds the pipe open: read its pid, not until EOF)
            child = subprocess.Popen([sys.executable, "-c", ORPHANER],
                                     stdout=subprocess.PIPE, text=True)
            orphan = int(child.stdout.readline())
            child.stdout.close()
            assert child.wait(timeout=60) == 0
            # re-parented to us (the subreaper), not to init: still our descendant
            assert orphan in descendants()
        assert time.monotonic() - started < 30
        assert not _alive(orphan)
        assert not os.path.exists(f"/proc/{orphan}")  # reaped, no zombie left
        assert keep.poll() is None  # ours from before the block: left alone
    finally:
        keep.kill()
        keep.wait()


def test_nothing_started_inside_costs_no_wait():
    started = time.monotonic()
    with none_left_behind(timeout=10.0):
        pass
    assert time.monotonic() - started < 1.0
