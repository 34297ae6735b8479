"""MLflow: one MLflow run per fedlm run, in the experiment ``track.project``.

The store is ``track.mlflow_uri``, by default a local SQLite file
``<track.dir>/mlflow.db`` (MLflow's own local store; browse it with
``mlflow ui --backend-store-uri sqlite:///runs/track/mlflow.db`` from the full
``mlflow`` package). The config goes in as parameters, the group and the fedlm
run as tags, each scalar as a metric at the point's version.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from fedlm.config import TrackConfig
from fedlm.store import ProgressPoint
from fedlm.track.record import TrackedRun, scalars

_STATUS = {"finished": "FINISHED", "interrupted": "KILLED"}  # anything else: FAILED
_BATCH = 100  # MLflow takes at most 100 parameters per call


def tracking_uri(track: TrackConfig) -> str:
    if track.mlflow_uri:
        return track.mlflow_uri
    return f"sqlite:///{(Path(track.dir) / 'mlflow.db').resolve()}"


class MlflowTracker:
    name = "mlflow"

    def __init__(self, track: TrackConfig) -> None:
        # Schema creation logs at INFO, and a server that does not answer gives a warning
        # with a traceback per retry: fedlm says what failed in one line of its own.
        for noisy in ("mlflow", "alembic", "urllib3"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        # MLflow retries a silent server 7 times with back-off (minutes); fewer and shorter,
        # unless the user set them (Follower bounds every call anyway)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        if not track.mlflow_uri:
            Path(track.dir).mkdir(parents=True, exist_ok=True)
        self._client = MlflowClient(tracking_uri=tracking_uri(track))
        self._run_id: str | None = None

    def start(self, run: TrackedRun) -> None:
        experiment = self._client.get_experiment_by_name(run.project)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self._client.create_experiment(run.project))
        tags = dict(run.tags)
        tags["mlflow.runName"] = run.name
        self._run_id = self._client.create_run(experiment_id, run_name=run.name,
                                               tags=tags).info.run_id
        params = [Param(k, str(v)) for k, v in run.params.items()]
        for k in range(0, len(params), _BATCH):
            self._client.log_batch(self._run_id, params=params[k:k + _BATCH])

    def log(self, point: ProgressPoint) -> None:
        now = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[
            Metric(key, value, now, point.version) for key, value in scalars(point).items()])

    def finish(self, status: str) -> None:
        if self._run_id is not None:
            self._client.set_terminated(self._run_id, _STATUS.get(status, "FAILED"))
