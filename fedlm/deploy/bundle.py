"""The Flower app bundle a deployment ships: the project's own code, nothing else.

``flwr run DIR`` packs every file under DIR that its ignore rules let through, reading
each one: run on the project folder, it read a FIFO there for ever (the deployment hung
after "Using SuperLink") and packed a ``--home`` kept inside the project, the live owner
token in its ``credentials.yaml`` included. So a deployment runs ``flwr run`` on a
staging folder that holds an explicit list: ``pyproject.toml`` and the Python files of
the packages the app imports (``fedlm``, ``strategies``, ``dashboard``), regular files
only (no link, FIFO or device is opened), never a file under the deployment's home.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

PACKAGES = ("fedlm", "strategies", "dashboard")  # pyproject's packages and package-dirs
TOP = ("pyproject.toml",)
SUFFIXES = (".py", ".toml")


def project_files(root: Path, home: Path | None = None) -> list[Path]:
    """The files the bundle holds, relative to ``root``, in a stable order."""
    root = root.resolve()
    keep = [Path(name) for name in TOP if _regular(root / name)]
    for package in PACKAGES:
        for folder, dirs, names in os.walk(root / package, followlinks=False):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                path = Path(folder) / name
                if path.suffix in SUFFIXES and _regular(path) and not _under(path, home):
                    keep.append(path.relative_to(root))
    return keep


def stage(root: Path, dest: Path, home: Path | None = None) -> Path:
    """``dest``, made anew with a copy of ``project_files(root)``: the folder to bundle."""
    shutil.rmtree(dest, ignore_errors=True)
    for rel in project_files(root, home):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target, follow_symlinks=False)
    return dest


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _under(path: Path, home: Path | None) -> bool:
    return home is not None and path.resolve().is_relative_to(home.resolve())
