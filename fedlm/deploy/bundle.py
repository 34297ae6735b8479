"""The Flower app bundle a deployment ships: the project's own code, nothing else.

``flwr run DIR`` packs every file under DIR that its ignore rules let through, reading
each one: run on the project folder, it read a FIFO there for ever (the deployment hung
after "Using SuperLink") and packed a ``--home`` kept inside the project, the live owner
token in its ``credentials.yaml`` included. So a deployment runs ``flwr run`` on a
staging folder that holds an explicit list: ``pyproject.toml`` and the Python files of
the packages the app imports (``fedlm``, ``strategies``, ``dashboard``), regular files
only (no link, FIFO or device is opened), never a file under the deployment's home.

The staging folder (``HOME/app``) is made anew at every run; what is in it is removed
only if it has a bundle's shape (``check_restageable``): a file of the user's put there
is named in one line, not deleted.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from fedlm.errors import ConfigError

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
    """``dest``, made anew with a copy of ``project_files(root)``: the folder to bundle.
    An earlier bundle there is removed; anything else is refused (``check_restageable``)."""
    check_restageable(dest)
    if os.path.lexists(dest):
        shutil.rmtree(dest)
    for rel in project_files(root, home):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target, follow_symlinks=False)
    return dest


def check_restageable(dest: Path) -> None:
    """ConfigError in one line, naming the path, if ``dest`` holds anything a bundle does
    not (so ``stage`` would delete what it did not make): a link, a FIFO, a file that is
    not the project's ``.py`` or ``.toml``. Nothing there, or an earlier bundle: returns."""
    stray = _stray(dest)
    if stray is not None:
        raise ConfigError(f"deploy: {stray} is not a file of fedlm's app bundle, which is "
                          f"made anew in {dest} at every run; move it out of {dest}")


def _stray(dest: Path) -> Path | None:
    """The first path under ``dest`` that a bundle would not hold (``dest`` itself if it is
    not a folder); None if there is none."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return dest
    for folder, dirs, names in os.walk(dest, followlinks=False, onerror=_raise):
        rel = Path(folder).relative_to(dest)
        for name in sorted(dirs):  # os.walk lists a link to a folder among the folders
            inside = rel / name
            if (os.path.islink(Path(folder) / name) or
                    not (inside.parts[0] in PACKAGES or name == "__pycache__")):
                return Path(folder) / name
        for name in sorted(names):
            path = Path(folder) / name
            inside = rel / name
            if not _regular(path):
                return path
            if inside.parts[0] in PACKAGES and len(inside.parts) > 1:
                ours = path.suffix in SUFFIXES or (rel.name == "__pycache__"
                                                   and path.suffix == ".pyc")
            else:
                ours = str(inside) in TOP
            if not ours:
                return path
    return None


def _raise(exc: OSError) -> None:
    raise exc


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _under(path: Path, home: Path | None) -> bool:
    return home is not None and path.resolve().is_relative_to(home.resolve())
