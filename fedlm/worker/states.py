"""A worker's inner-optimizer states, addressed by the job that produced them.

Every job message names the state to start from (``prev_job``: the worker's
last job whose update the server *accepted*; -1 for a fresh optimizer). The
worker saves the state its job ends with under the job's own id. So the server,
not the order messages happened to arrive in, decides what a worker builds on:

- an update that was rejected, lost or came too late leaves no trace: the next
  job starts again from the last accepted state;
- replay and ``fedlm run --resume`` re-run a job from exactly the state it
  first ran from.

States older than the job message's ``keep_from`` are deleted (the server keeps
that pointer at the oldest state a checkpoint may still need).

Three stores, same interface: a dict in this process (the in-process
backend; on a GPU its tensors stay in device memory), Flower's per-node
``context.state`` (memory; lost with the process) and node-local files (survive
a crash; needed for resume; in process written behind the jobs,
``fedlm.worker.state_writer``).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from fedlm import files
from fedlm.config import Config
from fedlm.data import cache_dir
from fedlm.job import FRESH

_SCHEDULE = "schedule_step"
_STATE_FILE = re.compile(r"job(\d+)\.pt")  # the file of a job's state


class MissingState(RuntimeError):
    """The state a job should start from is not on this worker."""


class BadState(RuntimeError):
    """A worker state file that is damaged, foreign, or holds more than tensors."""


def read_state(path: Path) -> dict:
    """A state written by ``DiskStates.write``, or a one-line ``BadState`` naming the file
    (torch's own words for a truncated file, or its advice to load a pickle with code in
    it unsafely, are not the user's to read)."""
    import pickle

    try:
        files.check(path, "worker state")  # a FIFO, a device, a huge file: not opened
        state = torch.load(path, weights_only=True)
    except files.FileRefused as exc:
        raise BadState(str(exc)) from None
    except pickle.UnpicklingError:  # weights_only refused what it holds: never code
        raise BadState(f"{path}: holds objects other than tensors and numbers; a worker "
                       f"state never does (refused, not run)") from None
    except Exception as exc:  # noqa: BLE001 - truncated, not torch's format at all, ...
        raise BadState(f"{path}: not a worker state fedlm can read (damaged or foreign: "
                       f"{type(exc).__name__})") from None
    if not isinstance(state, dict):
        raise BadState(f"{path}: not a worker state (a {type(state).__name__})")
    return state


class MemoryStates:
    """In a plain dict (the in-process transport). On a GPU the states stay in device
    memory between a worker's jobs (``device_resident``)."""

    device_resident = True

    def __init__(self) -> None:
        self.states: dict[int, dict] = {}

    def load(self, job_id: int) -> dict:
        if job_id == FRESH:
            return {}
        if job_id not in self.states:
            raise MissingState(f"no optimizer state of job {job_id} on this worker")
        return _copy(self.states[job_id])

    def save(self, job_id: int, state: dict) -> None:
        self.states[job_id] = state

    def prune(self, keep_from: int) -> None:
        for j in [j for j in self.states if j < keep_from]:
            del self.states[j]


class ContextStates:
    """In Flower's ``context.state`` (a RecordDict kept per node across messages)."""

    PREFIX = "fedlm.opt."
    device_resident = False  # Flower's records hold host arrays

    def __init__(self, state) -> None:
        self.state = state

    def load(self, job_id: int) -> dict:
        if job_id == FRESH:
            return {}
        key = f"{self.PREFIX}{job_id}"
        if key not in self.state:
            raise MissingState(f"no optimizer state of job {job_id} in this node's context")
        out = dict(self.state[key].to_torch_state_dict())
        out[_SCHEDULE] = int(self.state[f"{key}.meta"][_SCHEDULE])
        return out

    def save(self, job_id: int, state: dict) -> None:
        # Flower's records, imported here: the in-process backend and replay never keep
        # states in a context, and importing Flower costs them about 2 s per process.
        from flwr.app import ArrayRecord, ConfigRecord

        key = f"{self.PREFIX}{job_id}"
        self.state[key] = ArrayRecord(torch_state_dict={
            k: v for k, v in state.items() if k != _SCHEDULE})
        self.state[f"{key}.meta"] = ConfigRecord({_SCHEDULE: int(state[_SCHEDULE])})

    def prune(self, keep_from: int) -> None:
        pattern = re.compile(rf"^{re.escape(self.PREFIX)}(\d+)(\.meta)?$")
        for key in list(self.state.keys()):
            m = pattern.match(key)
            if m and int(m.group(1)) < keep_from:
                del self.state[key]


class DiskStates:
    """One file per state under ``folder`` (written atomically). With a ``writer``
    (``fedlm.worker.state_writer``: the in-process backend) the files are written
    behind the jobs and a state still in memory (written or not) is read from there."""

    device_resident = False

    def __init__(self, folder: Path, writer=None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.writer = writer

    def _path(self, job_id: int) -> Path:
        return self.folder / f"job{job_id}.pt"

    def load(self, job_id: int) -> dict:
        if job_id == FRESH:
            return {}
        if self.writer is not None:
            kept = self.writer.take_written(self, job_id)  # on disk too: no copy needed
            if kept is not None:
                return kept
            unwritten = self.writer.pending(self, job_id)  # the writer still needs it
            if unwritten is not None:
                return _copy(unwritten)
        path = self._path(job_id)
        if not path.exists():
            raise MissingState(f"no optimizer state of job {job_id} in {self.folder}")
        return read_state(path)

    def save(self, job_id: int, state: dict) -> None:
        if self.writer is not None:
            self.writer.save(self, job_id, state)
        else:
            self.write(job_id, state)

    def write(self, job_id: int, state: dict) -> None:
        # whole or not at all; a full disk keeps no half-written file
        files.write_cache(self._path(job_id), lambda tmp: torch.save(state, tmp))

    def prune(self, keep_from: int) -> None:
        if self.writer is not None:
            self.writer.prune(self, keep_from)
        else:
            self.delete_before(keep_from)

    def delete_before(self, keep_from: int) -> None:
        for path in self.folder.glob("job*.pt"):
            state = _STATE_FILE.fullmatch(path.name)  # not a write's temporary file
            if state and int(state.group(1)) < keep_from:
                path.unlink(missing_ok=True)


def _copy(state: dict) -> dict:
    """A state to start a job from: a copy, since the optimizer trains its moments in
    place, and a job whose update is then rejected must not have changed the state it
    started from."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def states_root() -> Path:
    """Where every run keeps its workers' states on this node."""
    return cache_dir() / "worker-state"


def run_folder(run_key: str) -> Path:
    """Where run ``run_key`` keeps its workers' states on this node."""
    return states_root() / run_key


def disk_folder(run_key: str, worker: int) -> Path:
    """Where a worker of run ``run_key`` keeps its states on this node."""
    return run_folder(run_key) / f"worker{worker}"


def worker_states(cfg: Config, run_key: str, worker: int, context_state=None,
                  writer=None):
    """The store a worker keeps its optimizer states in: node-local files with
    ``inner.state_store = disk`` (they survive a crashed process, which resume needs,
    and keep memory flat with thousands of simulated nodes; written behind the jobs
    by ``writer`` if given); else the node's Flower ``context.state`` when there is
    one, or a plain dict in this process."""
    if cfg.state_store() == "disk":
        return DiskStates(disk_folder(run_key, worker), writer)
    return ContextStates(context_state) if context_state is not None else MemoryStates()
