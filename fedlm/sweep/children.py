"""The ``fedlm run`` processes a sweep starts: each waited on by the thread that started
it, all stopped together when the sweep is (``Children.stop``), and none outliving a
sweep killed outright (the parent-death signal, Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from fedlm import interrupts


class Children:
    """The ``fedlm run`` processes a sweep has started; ``stop`` ends them (SIGTERM:
    each marks its run interrupted; SIGKILL after ``grace`` seconds) and starts
    no more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.stopping = threading.Event()
        # A sweep killed outright (SIGKILL, OOM) runs no ``stop``: its runs would go on
        # training, and a rerun would train their cells again beside them. SIGKILL, not
        # SIGTERM, so that they are gone at once however long a step takes; each reads
        # as crashed (its writer is gone) and the rerun trains its cell anew. Linux only:
        # elsewhere (None) they outlive the sweep.
        self._dies_with = interrupts.dies_with(os.getpid(), signal.SIGKILL)

    def run(self, cmd: list[str]) -> tuple[int, str, str] | None:
        """(exit status, stdout, stderr), or None if the sweep is stopping."""
        with self._lock:
            if self.stopping.is_set():
                return None
            # this thread waits for the child (communicate, below), so it outlives it,
            # as the parent-death signal needs (it follows the thread that forked)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, preexec_fn=self._dies_with)
            self._procs.add(proc)
        try:
            out, err = proc.communicate()
        finally:
            with self._lock:
                self._procs.discard(proc)
        return proc.returncode, out, err

    def stop(self, grace: float = 30.0) -> None:
        with self._lock:
            self.stopping.set()
            procs = list(self._procs)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
