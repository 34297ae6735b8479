"""The workers' state folders on this machine: whose they are, which a resume can
still use, and removing the rest (``fedlm states``).

With ``inner.state_store = disk`` a run keeps its workers' AdamW states under
``<cache>/worker-state/<run key>/`` (``fedlm.worker.states``). A run that ends for
good deletes them; a run that stops otherwise keeps them, since ``fedlm run --resume``
needs them with its checkpoint. A run killed and never resumed leaves them for good:
four workers of ``150m`` leave about 4 GB.

So a run writes who it is into its folder as it starts (``OWNER``: its store and run
id), and ``survey`` judges each folder by that run's state in its store:

- **kept**: the run is still running, or stopped with a checkpoint to resume from;
  a folder whose owner cannot be told (none written, its store not where it said,
  unreadable) is kept too: its run may resume from a store that moved;
- **removable**: its run finished or diverged, or has no checkpoint left (a resume
  could not use the states), and its store confirms that the run made this folder (an
  event the run writes as it claims it: a record is a file anyone could write); with
  ``older_than`` also a folder of unknown owner untouched for that long (one whose
  record names a run not in its store, or one its store does not confirm, among them).

Nothing outside the ``worker-state`` folder is removed, and no link is followed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from fedlm import files
from fedlm.errors import ConfigError, shown
from fedlm.checkpoint import folder_for
from fedlm.worker.states import run_folder, states_root

OWNER = "owner.json"
CLAIM_EVENT = "worker_states"  # the run's event naming its folder: the record's confirmation
GOING = ".removing"  # the name's suffix while ``remove`` deletes a folder


@dataclass(frozen=True)
class StateFolder:
    path: Path
    size: int  # bytes of its files
    idle_days: float  # since anything in it last changed
    owner: str  # "DB run N", or why it is not known
    removable: bool
    why: str  # the verdict's reason, one line


def claim(run_key: str, db: str | Path, run_id: int) -> None:
    """Write run ``run_id`` of store ``db`` into its state folder (before any state)."""
    folder = run_folder(run_key)
    folder.mkdir(parents=True, exist_ok=True)
    record = json.dumps({"db": str(Path(db).resolve()), "run_id": int(run_id)})
    files.write_cache(folder / OWNER, lambda tmp: tmp.write_text(record))


def survey(older_than: float | None = None) -> list[StateFolder]:
    """Every state folder under ``states_root``, judged (links and plain files skipped).
    A root that is itself a link is refused: what it points at is not ours to judge."""
    root = states_root()
    if root.is_symlink():
        raise ConfigError(f"{root}: is a link (to {shown(os.readlink(root), 120)}); "
                          f"`fedlm states` follows no link: replace it by a folder")
    out = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.is_symlink() or not path.is_dir():
            continue
        try:
            size, newest = _extent(path)
        except FileNotFoundError:  # removed meanwhile (another `fedlm states --clean`)
            continue
        idle = max(0.0, (time.time() - newest) / 86400)
        owner, removable, why = _judge(path)
        if removable is None:  # owner unknown: removable only when old enough
            removable = older_than is not None and idle >= older_than
            why += f"; idle for {older_than:g} days or more" if removable else ""
        out.append(StateFolder(path, size, idle, owner, removable, why))
    return out


def remove(folder: StateFolder) -> bool:
    """Delete ``folder`` (one ``survey`` found removable) and everything in it: True if
    this call removed it, False if another removal (a second ``fedlm states --clean`` at
    the same time) did; what the other already deleted is not an error. Renamed first,
    in one step: a removal killed midway leaves a folder the next ``survey`` knows is
    going (its owner record may be gone already), not one of unknown owner."""
    root = states_root()
    if folder.path.parent != root or folder.path.is_symlink() or root.is_symlink():
        raise ValueError(f"{folder.path}: not a state folder of {states_root()}")
    going = folder.path
    if not going.name.endswith(GOING):
        try:
            going = going.rename(going.with_name(going.name + GOING))
        except FileNotFoundError:  # the other removal renamed it: it removes it
            return False
    taken = []  # the folder itself was gone: the other removal ended it

    def already_gone(function, path, exc_info) -> None:  # shutil.rmtree's onerror
        if not issubclass(exc_info[0], FileNotFoundError):
            raise exc_info[1]
        if os.fspath(path) == os.fspath(going):  # its last rmdir (or first look) found none
            taken.append(path)

    shutil.rmtree(going, onerror=already_gone)
    return not taken


def _extent(path: Path) -> tuple[int, float]:
    """Bytes of the files under ``path`` and when the newest of them (or it) changed."""
    size, newest = 0, path.lstat().st_mtime
    for dirpath, dirnames, filenames in os.walk(path):  # os.walk follows no links
        for name, is_file in [(n, True) for n in filenames] + [(n, False) for n in dirnames]:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:  # removed meanwhile (its run pruned it)
                continue
            size += st.st_size if is_file else 0
            newest = max(newest, st.st_mtime)
    return size, newest


def _judge(path: Path) -> tuple[str, bool | None, str]:
    """(owner, removable, why); removable None: the owner cannot be told."""
    if path.name.endswith(GOING):
        return "unknown", True, "its removal was interrupted"
    if not os.path.lexists(path / OWNER):
        return "unknown", None, "no owner recorded"
    try:
        record = json.loads(files.read_text(path / OWNER, "owner record"))
        db, run_id = Path(record["db"]), int(record["run_id"])
    except (files.FileRefused, ValueError, KeyError, TypeError) as exc:
        return "unknown", None, f"its owner record is unreadable ({_first_line(exc)})"
    owner = f"{db} run {run_id}"
    if not db.is_file():
        return owner, None, "its store is not there (moved?)"
    from fedlm.store import readers  # sqlite only: no torch

    try:
        row = readers.run_row(db, run_id)
        damaged = row is not None and readers.damage(db, run_id)
    except Exception as exc:  # noqa: BLE001 - a store that cannot be read tells nothing
        return owner, None, f"its store cannot be read ({_first_line(exc)})"
    if row is None:  # a deleted run's, or a record naming a run it never was: unknown
        return owner, None, "its run is not in its store"
    if damaged:  # its status and owner cannot be trusted: as good as unknown
        return owner, None, f"its run's rows are damaged ({damaged})"
    status = readers.shown_status(row)
    if status == "running":
        return owner, False, "its run is running"
    if path.name not in readers.event_details(db, run_id, CLAIM_EVENT):
        # a record is a file anyone can write: only the store's word that this run made
        # the folder lets its run's end decide the folder's fate
        return owner, None, "its run never claimed this folder in its store"
    if status in ("finished", "diverged"):
        return owner, True, f"its run {status}"
    if not any(folder_for(db, run_id).glob("ckpt-v*.pt")):
        return owner, True, f"its run {status} with no checkpoint to resume from"
    return owner, False, (f"its run {status}; `fedlm run --resume {run_id} --db {db}` "
                          f"continues it")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
