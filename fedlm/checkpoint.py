"""Atomic, verified checkpoints of a run, and finding the newest good one.

A checkpoint holds the engine's ``state_dict`` (global weights, strategy and
local-steps state, version, clock, RNG states, jobs in flight and the model
versions they started from), how far each log table had got, and the run key
that names the workers' saved optimizer states. With those, ``fedlm run
--resume`` continues a killed run; on the virtual clock it ends bit-identical
to a run that was never killed.

File format: ``MAGIC``, the SHA-256 of the payload (64 hex characters), then
the payload (``torch.save``). Written to a temporary file, fsynced, renamed
over — so a crash leaves the old file or the new one, never half of one —
and read back only if the digest matches: a corrupt or truncated newest
checkpoint is skipped for the one before.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch

MAGIC = b"FEDLM-CKPT-1\n"
_DIGEST = 64


class NoCheckpoint(RuntimeError):
    pass


def folder_for(db: str | Path, run_id: int) -> Path:
    """Where run ``run_id`` of database ``db`` keeps its checkpoints."""
    db = Path(db).resolve()
    return db.parent / "checkpoints" / f"{db.stem}-run{run_id}"


def save(folder: Path, version: int, payload: dict[str, Any], keep: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    path = folder / f"ckpt-v{version:09d}.pt"
    tmp = folder / f".{path.name}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(MAGIC + hashlib.sha256(data).hexdigest().encode() + data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)
    for old in sorted(folder.glob("ckpt-v*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def read(path: Path) -> dict[str, Any]:
    """A checkpoint's payload; ``ValueError`` if the file is not a whole, intact one."""
    blob = path.read_bytes()
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + _DIGEST:
        raise ValueError("not a fedlm checkpoint (or truncated)")
    digest = blob[len(MAGIC):len(MAGIC) + _DIGEST].decode(errors="replace")
    data = blob[len(MAGIC) + _DIGEST:]
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError("checksum mismatch (corrupt or half-written)")
    return torch.load(io.BytesIO(data), weights_only=False)


def latest(folder: Path) -> tuple[dict[str, Any], Path, list[str]]:
    """The newest intact checkpoint, its path, and why newer ones were skipped."""
    skipped = []
    for path in sorted(folder.glob("ckpt-v*.pt"), reverse=True):
        try:
            return read(path), path, skipped
        except (OSError, ValueError, RuntimeError, EOFError) as exc:
            skipped.append(f"{path.name}: {exc}")
    raise NoCheckpoint(f"no intact checkpoint in {folder}"
                       + (f" ({'; '.join(skipped)})" if skipped else ""))
