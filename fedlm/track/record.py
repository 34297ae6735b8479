"""What a tracker is given: the run (``TrackedRun``) and, for each progress point of
the store (``fedlm.store.progress_points``), its scalars under stable names.

The step of every scalar is the point's model version (updates applied so far);
tokens and virtual time are scalars of their own at the same step, so that
W&B's and MLflow's charts can plot any metric against them (TensorBoard gets
perplexity against each as well, ``fedlm.track.to_tensorboard``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from fedlm.config import Config
from fedlm.store import ProgressPoint


@dataclass(frozen=True)
class TrackedRun:
    """One fedlm run as a tracker run: its names, its config as flat parameters, its tags."""

    run_id: int
    name: str  # the tracker run's name: "run<id>", then the run's own label if it has one
    project: str  # W&B project, MLflow experiment
    group: str  # "" = none
    params: dict[str, str | int | float | bool] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: Config, run_id: int, db: str | Path, label: str = "") -> "TrackedRun":
        name = f"run{run_id}" + (f" {label}" if label else "")
        tags = {"fedlm.store": str(Path(db).resolve()), "fedlm.run_id": str(run_id),
                "fedlm.strategy": cfg.strategy, "fedlm.seed": str(cfg.seed)}
        if cfg.track.group:
            tags["fedlm.group"] = cfg.track.group
        return cls(run_id, name, cfg.track.project, cfg.track.group, flat_params(cfg), tags)


def flat_params(cfg: Config) -> dict[str, str | int | float | bool]:
    """The config as dotted keys (``inner.lr``); lists and tables as JSON text.

    The ``track`` section is left out: where a run is tracked is not what it is."""
    out: dict[str, str | int | float | bool] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        elif isinstance(value, (str, int, float, bool)):
            out[prefix.rstrip(".")] = value
        else:  # lists, empty tables and None as JSON text
            out[prefix.rstrip(".")] = json.dumps(value, sort_keys=True)

    raw = cfg.to_dict()
    raw.pop("track", None)
    for key, value in raw.items():
        walk(f"{key}.", value)
    return out


def scalars(point: ProgressPoint) -> dict[str, float]:
    """A progress point's values under the names every tracker shows."""
    return {
        "val/loss": point.loss,
        "val/perplexity": point.perplexity,
        "val/bits_per_byte": point.bits_per_byte,
        "progress/tokens": float(point.tokens),
        "progress/virtual_time": point.virtual_time,
        "progress/jobs": float(point.jobs),
        "fleet/idle_fraction": point.idle_fraction,
        "fleet/mean_staleness": point.mean_staleness,
        "fleet/bytes_down": float(point.bytes_down),
        "fleet/bytes_up": float(point.bytes_up),
        "fleet/lost_jobs": float(point.lost_jobs),
    }
