"""Worker states written to disk behind the jobs, not in their way.

With ``inner.state_store = disk`` (the default while checkpoints are on) every job's
optimizer state goes to a file, so a run whose process died can resume
(``fedlm.worker.states.DiskStates``). Written as the job ends, the write sits on the
job's path: AdamW's two moments are twice the model (930 MB at ``150m``), and the
write and the next job's read of them measured 2.0 s a job on the CPU machine, more
than the rest of what happens around a job there.

A ``StateWriter`` takes the writes over (the in-process backend has one): ``save``
hands it the state and returns, one thread writes the files in the order they were
saved, prunes too, in order. Until its file is written a state is served from
memory, so a worker's next job never waits for the disk. A written state stays in
memory too while there is room for it, and the job that starts from it takes it
without reading the file (its file keeps it, should that job's update be rejected):
reading it back cost a job at ``20m`` 0.04 s of the 0.15 s around it on the CPU.

What resume needs does not change: the engine calls ``flush`` before each checkpoint,
so every state saved before a checkpoint is on disk when the checkpoint is. A write
that fails (a full disk) is raised by the next ``flush``, which stops the run at that
checkpoint with the reason; until then the state stays in memory and the jobs go on.
Memory is bounded: the states kept (written or not) hold at most ``budget`` bytes
(one state always fits). ``save`` makes room by dropping written states, the newest
first, and waits for writes when none is left to drop. Newest first, because jobs
come round the workers in turn: the state a worker wrote longest ago is the one
needed soonest, and dropping the oldest would drop each state just before its use.
"""

from __future__ import annotations

import threading
from collections import deque

from fedlm.sim.memory import STATES_KEPT  # the run-size estimate counts them too

BUDGET = STATES_KEPT  # bytes of states kept in memory, written or waiting to be
CLOSE_WAIT = 120.0  # seconds close() waits for the write in progress


class StateWriteError(RuntimeError):
    """A worker state that should be on disk (for resume) could not be written."""


def _nbytes(state: dict) -> int:
    """A state's tensor bytes (its schedule step, an int, has none)."""
    return sum(getattr(v, "nbytes", 0) for v in state.values())


class StateWriter:
    def __init__(self, budget: int = BUDGET) -> None:
        self.budget = budget
        self._cond = threading.Condition()
        self._queue: deque = deque()  # ("save", store, job_id) | ("prune", store, keep_from)
        self._pending: dict[tuple, dict] = {}  # (folder, job_id) -> state not written yet
        self._written: dict[tuple, dict] = {}  # (folder, job_id) -> state on disk too, by age
        self._pruned: dict = {}  # folder -> the highest keep_from asked for
        self._bytes = 0
        self._busy = False
        self._closed = False
        self._error: StateWriteError | None = None
        self._thread = threading.Thread(target=self._work, name="fedlm-state-writer",
                                        daemon=True)
        self._thread.start()

    # -- what the stores call (any thread) --------------------------------------

    def save(self, store, job_id: int, state: dict) -> None:
        """Queue ``state`` to be written as ``store``'s state of ``job_id``; it must not
        change afterwards (a job's exported state is its own)."""
        size = _nbytes(state)
        with self._cond:
            while self._bytes and self._bytes + size > self.budget:
                if self._written:
                    self._drop(next(reversed(self._written)))  # the newest: see above
                elif self._error is not None or self._closed:
                    break  # no write will make room: kept in memory all the same
                else:
                    self._cond.wait()
            replaced = self._pending.get((store.folder, job_id), {})  # saved twice
            self._pending[(store.folder, job_id)] = state
            self._bytes += size - _nbytes(replaced)
            if not self._closed:  # else kept in memory only (the run has ended)
                self._queue.append(("save", store, job_id))
            self._cond.notify_all()

    def pending(self, store, job_id: int) -> dict | None:
        """``store``'s state of ``job_id`` if it is not on disk yet (else None); shared
        with the writer: copy it before changing it."""
        with self._cond:
            if job_id < self._pruned.get(store.folder, -1):
                return None
            return self._pending.get((store.folder, job_id))

    def take_written(self, store, job_id: int) -> dict | None:
        """``store``'s state of ``job_id`` if it is on disk and still in memory (else
        None): the caller's own from now on, memory keeps it no longer."""
        with self._cond:
            key = (store.folder, job_id)
            if key not in self._written:
                return None
            state = self._written[key]
            self._drop(key)
            return state

    def prune(self, store, keep_from: int) -> None:
        """``store``'s states before ``keep_from`` go: those not written yet are never
        written, the files are deleted in order with the writes."""
        with self._cond:
            self._pruned[store.folder] = max(keep_from, self._pruned.get(store.folder, -1))
            for key in [k for k in self._written if k[0] == store.folder and k[1] < keep_from]:
                self._drop(key)
            self._queue.append(("prune", store, keep_from))
            self._cond.notify_all()

    def flush(self) -> None:
        """Wait until every state saved so far is on disk; raise a failed write's error."""
        with self._cond:
            while (self._queue or self._busy) and not self._closed:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            if self._closed:  # its queue was dropped: nothing says the states are on disk
                raise StateWriteError("worker states cannot be flushed: the run's state "
                                      "writer was closed")

    def close(self) -> None:
        """Stop: the writes not started are dropped (a run that ends needs none of them:
        a finished run deletes its states, an interrupted one resumes from a checkpoint,
        whose states were flushed), the one in progress is waited for."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            for key in list(self._written):
                self._drop(key)
            self._cond.notify_all()  # a flush waiting returns, a save waiting goes on
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT)

    # -- the writer thread -------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                kind, store, arg = self._queue.popleft()
                state = None
                if kind == "save":
                    key = (store.folder, arg)
                    state = self._pending.get(key)  # None: an earlier save of it wrote it
                    if state is None or arg < self._pruned.get(store.folder, -1):
                        self._bytes -= _nbytes(self._pending.pop(key, {}))  # pruned first
                        self._cond.notify_all()
                        continue
                self._busy = True
            written = self._do(kind, store, arg, state)
            with self._cond:
                self._busy = False
                key = (store.folder, arg)
                # saved again while it was written: that save's own entry writes the newer
                if written and self._pending.get(key) is state:
                    del self._pending[key]
                    if self._closed or arg < self._pruned.get(store.folder, -1):
                        self._bytes -= _nbytes(state)  # no job will start from it
                    else:
                        self._bytes -= _nbytes(self._written.pop(key, {}))  # saved twice
                        self._written[key] = state  # still counted in _bytes
                self._cond.notify_all()

    def _drop(self, key: tuple) -> None:
        """Forget a written state (its file has it); with ``_cond`` held."""
        self._bytes -= _nbytes(self._written.pop(key))
        self._cond.notify_all()

    def _do(self, kind: str, store, arg: int, state: dict | None) -> bool:
        try:
            if kind == "save":
                store.write(arg, state)
            else:
                store.delete_before(arg)
            return kind == "save"
        except Exception as exc:  # noqa: BLE001 - kept for flush, the state kept in memory
            with self._cond:
                if self._error is None:
                    what = (f"worker state of job {arg} could not be written" if kind == "save"
                            else f"worker states before job {arg} could not be deleted")
                    self._error = StateWriteError(
                        f"{what} in {store.folder}: {type(exc).__name__}: {exc}")
            return False
