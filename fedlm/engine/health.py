"""A run's health, the part of the engine's loop that watches the global model: its
evaluations (every ``eval.every`` versions, and once more where a worker's update came
back NaN or Inf from a model not yet evaluated), and the stops of a run that diverged
(``fedlm.engine.divergence``) or can make no progress (``fedlm.engine.stall``), each in
one line; and the progress shown while it runs.
"""

from __future__ import annotations

import math
import time
from typing import NoReturn

from fedlm.engine.types import Diverged, EngineError, Progress
from fedlm.job import JobSpec


class Health:
    """A mixin of ``Engine``: its evaluations and its stops (it reads the engine's
    evaluator, log, divergence and stall watches, and totals)."""

    def _suspect_model(self, job: JobSpec, reason: str) -> None:
        """A worker's update came back NaN or Inf (``rejected``) without an injected
        fault: if the model of now was not evaluated yet, evaluate it, so that a global
        model the server's own step broke (an outer lr of 1e30, say) stops the run as
        diverged, not as workers that failed every job."""
        if reason == "rejected" and not job.fault and self.last_eval_version != self.version:
            self._evaluate()

    def _evaluate(self) -> None:
        self.last_eval_version = self.version
        if self.evaluate is None:
            return
        ev = self.evaluate(self.params)
        self.last_perplexity = ev.perplexity
        if math.isfinite(ev.perplexity):  # else no point of a curve (NaN: not even a row)
            self.log.metric(version=self.version, virtual_time=self.now,
                            wall_time=time.time() - self.wall_start, tokens=self.tokens,
                            jobs=self.jobs_done, loss=ev.loss, perplexity=ev.perplexity,
                            bits_per_byte=ev.bits_per_byte)
        self._report()
        why = self.divergence.check(self.version, ev.loss)
        if why is not None:
            self._diverged(why)

    def _check_progress(self) -> None:
        """Stop a run that can make no progress (``fedlm.engine.stall``), in one line."""
        why = self.stall.why_stalled(self.version, self.server.strategy_name)
        if why is not None:
            self.log.stalled(self.now, why)
            self._close_timeline(why="run stalled")
            raise EngineError(why)

    def _diverged(self, why: str) -> NoReturn:
        """Stop here: the rest of the run would only train a broken model."""
        self.log.diverged(self.now, why)
        self._close_timeline(why="run diverged")
        raise Diverged(why, version=self.version)

    def _report(self) -> None:
        if self.progress:
            self.progress(Progress(self.version, self.versions_wanted, self.now,
                                   self.jobs_done, self.tokens, self.last_perplexity,
                                   self.steps_done, self.cfg.local_step_budget))
