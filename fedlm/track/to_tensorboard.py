"""TensorBoard: event files under ``<track.dir>/tensorboard/[<group>/]<run name>``.

Each scalar at the point's version; perplexity also against tokens
(``by_tokens/``) and whole virtual seconds (``by_virtual_second/``), since a
TensorBoard chart has one step axis. The config goes in as hyperparameters
(the HParams tab) and as a text table. ``tensorboard --logdir runs/track/tensorboard``.
"""

from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
from torch.utils.tensorboard.summary import hparams

from fedlm.config import TrackConfig
from fedlm.store import ProgressPoint
from fedlm.track.record import TrackedRun, scalars


def run_dir(track: TrackConfig, run: TrackedRun) -> Path:
    safe = run.name.replace("/", "_").replace(" ", "_")
    return Path(track.dir) / "tensorboard" / (run.group.replace("/", "_") or ".") / safe


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, track: TrackConfig) -> None:
        self._track = track
        self._writer: SummaryWriter | None = None

    def start(self, run: TrackedRun) -> None:
        self._writer = SummaryWriter(log_dir=str(run_dir(self._track, run)))
        table = "\n".join(f"| {k} | {v} |" for k, v in run.params.items())
        self._writer.add_text("config", "| key | value |\n|---|---|\n" + table)
        # the HParams tab: the config, and the metric it is judged by
        for summary in hparams(run.params, {"val/perplexity": float("nan")}):
            self._writer.file_writer.add_summary(summary)

    def log(self, point: ProgressPoint) -> None:
        for tag, value in scalars(point).items():
            self._writer.add_scalar(tag, value, point.version)
        self._writer.add_scalar("by_tokens/perplexity", point.perplexity, point.tokens)
        self._writer.add_scalar("by_virtual_second/perplexity", point.perplexity,
                                round(point.virtual_time))

    def finish(self, status: str) -> None:
        if self._writer is not None:
            self._writer.add_text("status", status)
            self._writer.close()
