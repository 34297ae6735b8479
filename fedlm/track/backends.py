"""The trackers fedlm knows, what one is (``Tracker``), and opening them.

A new tracker plugs in as a class with ``name``, ``start``, ``log`` and ``finish``,
registered in ``BACKENDS`` (and its name in ``fedlm.config.TRACKERS``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import replace
from typing import Protocol

from fedlm.config import Config, TrackConfig
from fedlm.errors import ConfigError, first_line
from fedlm.store import ProgressPoint
from fedlm.track.record import TrackedRun

# tracker name -> (its module here, its class, the packages it needs: MLflow's local
# SQLite store needs SQLAlchemy and Alembic beside mlflow-skinny)
BACKENDS = {
    "tensorboard": ("fedlm.track.to_tensorboard", "TensorBoardTracker", ("tensorboard",)),
    "mlflow": ("fedlm.track.to_mlflow", "MlflowTracker", ("mlflow", "sqlalchemy", "alembic")),
    "wandb": ("fedlm.track.to_wandb", "WandbTracker", ("wandb",)),
}


class Tracker(Protocol):
    """What a tracker does with a run; a new one plugs in through ``BACKENDS``."""

    name: str

    def start(self, run: TrackedRun) -> None: ...

    def log(self, point: ProgressPoint) -> None: ...

    def finish(self, status: str) -> None: ...


def with_trackers(cfg: Config, names: list[str] | None) -> Config:
    """``cfg`` with the trackers ``names`` (``--track``) added to its ``track.backends``."""
    added = [n for n in dict.fromkeys(names or []) if n not in cfg.track.backends]
    if not added:
        return cfg
    return replace(cfg, track=replace(cfg.track, backends=[*cfg.track.backends, *added]))


def check_installed(names: list[str]) -> None:
    """Refuse, in one line, a tracker whose package is not installed (before a run starts)."""
    missing = [package for name in names for package in BACKENDS[name][2]
               if importlib.util.find_spec(package) is None]
    if missing:
        raise ConfigError(f"track: {', '.join(missing)} not installed (for "
                          f"{', '.join(names)}); install the trackers with: "
                          f"pip install 'fedlm[track]'")


def open_trackers(track: TrackConfig) -> list[Tracker]:
    """One tracker per name of ``track.backends``, ready for ``start``. One that cannot
    be opened (a bad ``mlflow_uri``, a folder it cannot write) is left out with one
    line on stderr, as a tracker failing later is: the run does not depend on it."""
    check_installed(track.backends)
    trackers = []
    for name in track.backends:
        module, cls, _ = BACKENDS[name]
        try:
            trackers.append(getattr(importlib.import_module(module), cls)(track))
        except Exception as exc:  # noqa: BLE001  (whatever the tracker's library raises)
            print(f"fedlm: tracking: {name} failed to open ({type(exc).__name__}: "
                  f"{first_line(exc)}); the run goes on without it", file=sys.stderr,
                  flush=True)
    return trackers
