"""Weights & Biases: one W&B run per fedlm run, offline by default.

Offline (``track.wandb_mode``), the run is files under ``<track.dir>/wandb/``
(``offline-run-*``), uploaded later with ``wandb sync`` if wanted; nothing
touches the network. The config is the run's config and its tags, the group
``track.group`` (a sweep's seeds of one arm together), each scalar logged at
the point's version. W&B's console capture and system metrics are off: the
run's progress bar stays fedlm's.
"""

from __future__ import annotations

from pathlib import Path

import wandb
from wandb.sdk import wandb_setup

from fedlm.config import TrackConfig
from fedlm.store import ProgressPoint
from fedlm.track.record import TrackedRun, scalars

_EXIT_CODE = {"finished": 0, "interrupted": 130}  # anything else: 1


def _settings() -> wandb.Settings:
    """Quiet and local: no console capture, system metrics, git or code saving."""
    return wandb.Settings(silent=True, console="off", x_disable_stats=True,
                          x_disable_meta=True, disable_git=True, save_code=False)


class WandbTracker:
    name = "wandb"

    def __init__(self, track: TrackConfig) -> None:
        self._track = track
        self._run = None
        # W&B logs through a service process: start it now, before a Flower simulation
        # (whose end stops every process started during it, fedlm.flower.leftovers)
        wandb.setup(_settings())
        wandb_setup.singleton().ensure_service()

    def start(self, run: TrackedRun) -> None:
        folder = Path(self._track.dir)
        folder.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            mode=self._track.wandb_mode, dir=str(folder), project=run.project,
            group=run.group or None, name=run.name, config={**run.params, **run.tags},
            settings=_settings(), reinit="create_new")

    def log(self, point: ProgressPoint) -> None:
        self._run.log(scalars(point), step=point.version)

    def finish(self, status: str) -> None:
        if self._run is not None:
            self._run.finish(exit_code=_EXIT_CODE.get(status, 1))
