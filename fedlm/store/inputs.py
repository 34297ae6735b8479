"""A run owns its inputs: the files its config names are pinned by content hash.

A stored run keeps its config, which names files by path: FedScale traces
(``fleet.device_trace``, ``fleet.availability_trace``), the weights it starts from
(``init.from`` when it is a file) and a text corpus (``data.source = text:GLOB``). A
path says nothing of what the file held: rewrite a trace after a crash and a resumed
run would finish on another fleet, and replay would compare against it and call the
result identical. So a new run records the SHA-256 of every such file (events of kind
``input_file``: key, path, digest), and ``fedlm run --resume`` and ``fedlm replay``
refuse, in one line, to go on when a file's contents differ from what the run began
with. Runs stored before this have no such events and are not checked.
"""

from __future__ import annotations

import glob
import hashlib
import json
from pathlib import Path
from typing import Any

from fedlm import files
from fedlm.config import Config
from fedlm.errors import ConfigError, shown_key

KIND = "input_file"  # the events that pin them


def named_files(cfg: Config) -> list[tuple[str, list[str]]]:
    """(config key, the files it names) for every file-naming setting in use."""
    out = []
    for key in ("device_trace", "availability_trace"):
        if getattr(cfg.fleet, key):
            out.append((f"fleet.{key}", [getattr(cfg.fleet, key)]))
    ref = cfg.init.from_
    if ref and Path(ref).is_file():  # a run id or DB:RUN is the store's own, not a file
        out.append(("init.from", [ref]))
    if cfg.data.source.startswith("text:"):
        out.append(("data.source", sorted(glob.glob(cfg.data.source[5:], recursive=True))))
    return out


def _digest(paths: list[str], what: str) -> str:
    """SHA-256 of the files' contents (and, for several, of their names in order)."""
    whole = hashlib.sha256()
    for p in paths:
        files.check(p, what)
        h = hashlib.sha256()
        with open(p, "rb") as f:  # in pieces: a checkpoint may be GBs
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if len(paths) == 1:
            return h.hexdigest()
        whole.update(f"{p}\0{h.hexdigest()}\n".encode())
    return whole.hexdigest()


_WHAT = {"fleet.device_trace": "trace", "fleet.availability_trace": "trace",
         "init.from": "checkpoint", "data.source": "text"}


def pins(cfg: Config) -> list[dict[str, Any]]:
    """What a new run records: each named file's key, path and digest."""
    return [{"key": key, "path": paths[0] if len(paths) == 1 else cfg.data.source,
             "sha256": _digest(paths, _WHAT[key])} for key, paths in named_files(cfg)]


def record(writer, pinned: list[dict[str, Any]]) -> None:
    """Keep ``pinned`` (``pins``) in the run that ``writer`` is writing."""
    for pin in pinned:
        writer.add_event(kind=KIND, virtual_time=0.0, detail=json.dumps(pin, sort_keys=True))


def check_unchanged(stored: list[str], cfg: Config, run_id: int, action: str) -> None:
    """Refuse (one-line ``ConfigError``) to ``action`` run ``run_id`` if a file it pinned
    (``stored``: its ``input_file`` events' details) now holds something else."""
    now = {pin["key"]: pin for pin in _pins_or_missing(cfg)}
    for detail in stored:
        then = json.loads(detail)
        pin = now.get(then["key"])
        if pin is None or pin["sha256"] != then["sha256"]:
            was = f"sha256 {then['sha256'][:16]}... then"
            is_now = "now unreadable" if pin is None else f"{pin['sha256'][:16]}... now"
            raise ConfigError(f"{then['key']}: {shown_key(then['path'])} is not the file run "
                              f"{run_id} started with ({was}, {is_now}): refusing to "
                              f"{action} it on other contents")


def _pins_or_missing(cfg: Config) -> list[dict[str, Any]]:
    out = []
    for key, paths in named_files(cfg):
        try:
            out.append({"key": key, "sha256": _digest(paths, _WHAT[key])})
        except (files.FileRefused, OSError):
            continue  # gone or unreadable: reported as not the same file
    return out
