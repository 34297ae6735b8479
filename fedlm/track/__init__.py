"""Experiment trackers: a run's metrics also go to TensorBoard, MLflow or W&B.

fedlm's own store stays the record; a tracker gets a copy, read from the store
as the run writes it (``Follower``, on each progress report) or afterwards
(``fedlm export RUN --track NAME``): the same rows both ways. A tracker that
fails is dropped with one line on stderr; the run goes on.

    record.py          TrackedRun (names, config as parameters, tags) and the scalars
                       of a progress point (fedlm.store.progress_points)
    backends.py        the Tracker protocol, the registry of backends, opening them
    follower.py        Follower: hands new progress points to the trackers
    to_tensorboard.py  TensorBoard event files
    to_mlflow.py       MLflow (a local SQLite store by default)
    to_wandb.py        Weights & Biases (offline by default)

The trackers are an optional extra: ``pip install 'fedlm[track]'``.
"""

from __future__ import annotations

from fedlm.track.backends import BACKENDS, Tracker, check_installed, open_trackers, with_trackers
from fedlm.track.follower import Exported, Follower, export
from fedlm.track.record import TrackedRun

__all__ = ["BACKENDS", "Exported", "Follower", "export", "TrackedRun", "Tracker", "check_installed", "open_trackers",
           "with_trackers"]
