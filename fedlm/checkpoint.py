"""Atomic, verified checkpoints of a run, and finding the newest good one.

A checkpoint holds the engine's ``state_dict`` (global weights, strategy and
local-steps state, version, clock, RNG states, jobs in flight and the model
versions they started from), how far each log table had got, and the run key
that names the workers' saved optimizer states. With those, ``fedlm run
--resume`` continues a killed run; on the virtual clock it ends bit-identical
to a run that was never killed.

File format: ``MAGIC``, the SHA-256 of the payload (64 hex characters), then
the payload (``torch.save``). It is read with ``torch.load(weights_only=True)``: tensors,
numbers, strings, containers and fedlm's own plain records (``SAFE_CLASSES``), nothing
that can name a function, so a crafted file runs no code however it got into the
folder or ``init.from``; the digest only proves a file whole, not harmless. Written to a temporary file, fsynced, renamed
over — so a crash leaves the old file or the new one, never half of one —
and read back only if the digest matches: a corrupt or truncated newest
checkpoint is skipped for the one before.

A checkpoint names the run it belongs to (``identity``: the store's id and
path, the run id and when the run was made), and ``latest`` refuses one that
names another: a resume never continues from another run's weights. The
folder is derived from the store's full path, so two stores side by side
(``x.db`` and ``x.sqlite``) never share one; a store moved with its
``checkpoints/`` folder finds its run's folder by what its checkpoints name
(``locate``).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from fedlm import files

MAGIC = b"FEDLM-CKPT-1\n"
_DIGEST = 64


class NoCheckpoint(RuntimeError):
    pass


class ForeignCheckpoint(RuntimeError):
    """A checkpoint in the run's folder belongs to another run or store."""


def folder_for(db: str | Path, run_id: int) -> Path:
    """Where run ``run_id`` of database ``db`` keeps its checkpoints: beside the
    database, named by its file name and a digest of its full path."""
    db = Path(db).resolve()
    tag = hashlib.sha256(str(db).encode()).hexdigest()[:12]
    return db.parent / "checkpoints" / f"{db.name}-{tag}-run{run_id}"


def locate(db: str | Path, run_id: int, expect: dict[str, Any]) -> Path | None:
    """The folder that holds run ``run_id``'s checkpoints, or None if none does.

    Its own (``folder_for``); or, for a store moved or renamed together with its
    ``checkpoints/`` folder (the path digest in the folder's name changed), the
    folder beside it of the same run id whose checkpoints name this store and run
    (``expect``: ``identity``), renamed to its own name so that the resumed run
    goes on writing there."""
    own = folder_for(db, run_id)
    if any(own.glob("ckpt-v*.pt")):
        return own
    for other in sorted(own.parent.glob(f"*-run{run_id}")):
        if other == own or not other.is_dir():
            continue
        try:
            latest(other, expect)
        except (NoCheckpoint, ForeignCheckpoint):  # another store's, beside this one
            continue
        try:
            if own.is_dir():
                own.rmdir()  # empty: it held no checkpoint
            other.rename(own)
        except OSError:  # cannot rename it: resume from where it is
            return other
        return own
    return None


def identity(store_id: str, db: str | Path, run_id: int, created_at: float) -> dict[str, Any]:
    """What a checkpoint says about whose it is (``save(..., payload={"run": ...})``)."""
    return {"store_id": store_id, "db": str(Path(db).resolve()), "run_id": run_id,
            "created_at": created_at}


def weights_for(db: str | Path, run_id: int) -> Path:
    """Where a finished run of ``db`` keeps its final weights (``init.from`` reads them)."""
    db = Path(db).resolve()
    tag = hashlib.sha256(str(db).encode()).hexdigest()[:12]
    return db.parent / "weights" / f"{db.name}-{tag}-run{run_id}.pt"


class UnsafeState(ValueError):
    """A payload that a checkpoint cannot carry: reading it back would refuse it."""


PLAIN = (torch.Tensor, int, float, bool, str, bytes, type(None))


def check_plain(obj: Any, where: str = "state") -> None:
    """Refuse (``UnsafeState``, naming where) anything ``read`` would not build: a
    checkpoint of it would be written, then skipped at resume, the run started over."""
    if isinstance(obj, PLAIN):
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, (str, int, float, bool, type(None))):
                raise UnsafeState(f"{where} has a key of type {type(key).__name__}")
            check_plain(value, f"{where}[{key!r}]")
        return
    if isinstance(obj, (list, tuple)) and (type(obj) in (list, tuple) or _safe(type(obj))):
        for k, value in enumerate(obj):
            check_plain(value, f"{where}[{k}]")
        return
    if _safe(type(obj)):
        for name in getattr(obj, "__dataclass_fields__", {}):
            check_plain(getattr(obj, name), f"{where}.{name}")
        return
    raise UnsafeState(f"{where} is an object of {type(obj).__module__}.{type(obj).__qualname__}, which a "
                      f"checkpoint cannot carry (tensors, numbers, strings, lists, tuples "
                      f"and dicts of them only)")


def _safe(cls: type) -> bool:
    return cls in safe_classes() or (issubclass(cls, tuple) and hasattr(cls, "_fields")
                                     and cls.__module__.startswith("fedlm"))


def write(path: Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` in the checkpoint format, atomically; ``UnsafeState``
    first for a payload that could not be read back."""
    check_plain(payload, "checkpoint")
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + hashlib.sha256(data).hexdigest().encode() + data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # disk full, say: a half-written file would keep it full
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, f"{path}: cannot write the checkpoint "
                                 f"({exc.strerror or exc})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)
    return path


def save(folder: Path, version: int, payload: dict[str, Any], keep: int) -> Path:
    path = write(folder / f"ckpt-v{version:09d}.pt", payload)
    for old in sorted(folder.glob("ckpt-v*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def read(path: Path, map_location: str = "cpu") -> dict[str, Any]:
    """A checkpoint's payload, its tensors on ``map_location``; ``ValueError`` if the
    file is not a whole, intact one."""
    blob = files.read_bytes(path, "checkpoint")  # a FIFO, a device, a huge file: refused
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + _DIGEST:
        raise ValueError("not a fedlm checkpoint (or truncated)")
    digest = blob[len(MAGIC):len(MAGIC) + _DIGEST].decode(errors="replace")
    data = blob[len(MAGIC) + _DIGEST:]
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError("checksum mismatch (corrupt or half-written)")
    return load_tensors(data, map_location)


def load_tensors(data: bytes, map_location: str = "cpu") -> Any:
    """``torch.load`` of ``data`` that builds tensors, plain values and ``SAFE_CLASSES``
    only; anything else (a pickled function or class) is a one-line ``ValueError``."""
    try:
        with torch.serialization.safe_globals(safe_classes()):
            return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        asked = next((line.split("GLOBAL", 1)[1].strip().split()[0]
                      for line in str(exc).splitlines() if "GLOBAL" in line), "an object")
        raise ValueError(f"holds {asked}, which fedlm does not load (a checkpoint holds "
                         f"tensors, numbers, strings and fedlm's own records only)") from None


def safe_classes() -> list[type]:
    """fedlm's own plain records that an engine state holds (frozen dataclasses and
    enums: built from their fields, with no code of their own run)."""
    from fedlm.engine import events, types
    from fedlm.job import JobResult, JobSpec
    from fedlm.sim.dynamics import Straggle
    from fedlm.sim.fleet import JobTiming, Region, WorkerProfile
    from fedlm.store import IntervalKind
    from fedlm.strategies.base import Update
    from fedlm.servers import Message
    return [types.InFlight, types.JobDone, types.BackOnline, types.Delivery, types.Wake,
            events._JobEnds,
            events._LinkChange, events._Computed, events._Uploaded, events._Deadline, JobSpec,
            JobResult, JobTiming, Region, WorkerProfile, Straggle, IntervalKind, Update, Message]


def latest(folder: Path, expect: dict[str, Any], map_location: str = "cpu"
           ) -> tuple[dict[str, Any], Path, list[str]]:
    """The newest intact checkpoint, its path, and why newer ones were skipped.

    ``expect`` is the run's ``identity``: a checkpoint that names another store
    or run raises ``ForeignCheckpoint`` (never loaded, nor skipped for an older
    one: the folder is not this run's alone)."""
    skipped = []
    for path in sorted(folder.glob("ckpt-v*.pt"), reverse=True):
        try:
            payload = read(path, map_location)
        except (OSError, ValueError, RuntimeError, EOFError) as exc:
            skipped.append(f"{path.name}: {exc}")
            continue
        owner = payload.get("run") or {}
        if any(owner.get(k) != expect[k] for k in ("store_id", "run_id", "created_at")):
            whose = (f"run {owner['run_id']} of {owner['db']}" if "run_id" in owner
                     else "no run (an older checkpoint format)")
            raise ForeignCheckpoint(f"checkpoint {path} belongs to {whose}, not to run "
                                    f"{expect['run_id']} of {expect['db']}; refusing to load it")
        return payload, path, skipped
    raise NoCheckpoint(f"no intact checkpoint in {folder}"
                       + (f" ({'; '.join(skipped)})" if skipped else ""))
