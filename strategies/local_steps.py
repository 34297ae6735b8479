"""Local-steps policies: how many inner steps a worker's next job gets.

Chosen independently of the strategy (config key ``local_steps``). A policy
sees the worker's profile-derived speed and the configured H and returns an
int >= 1.
"""

from __future__ import annotations

import copy
import math
import statistics
from abc import ABC, abstractmethod
from typing import ClassVar


class LocalSteps(ABC):
    name: ClassVar[str] = ""
    # Whether it sizes jobs so that the ones handed out together finish together
    # (then the engine's grace = "auto" waits for them: fedlm/engine/grace.py).
    even_times: ClassVar[bool] = False

    def start(self, *, steps: int, step_times: list[float]) -> None:
        """``steps`` = configured H; ``step_times`` = nominal seconds per step per worker."""
        self.steps = steps
        self.step_times = list(step_times)

    @abstractmethod
    def local_steps(self, worker: int) -> int:
        """Inner steps for ``worker``'s next job."""

    def observe(self, worker: int, *, steps: int, seconds: float) -> None:
        """A job of ``steps`` steps took ``seconds`` of compute (for online estimates)."""

    def state_dict(self) -> dict:
        """What the policy has learnt so far (for checkpoints): its attributes."""
        return copy.deepcopy(vars(self))

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(copy.deepcopy(state))


class Fixed(LocalSteps):
    """Every job runs the configured H steps."""

    name = "fixed"

    def local_steps(self, worker: int) -> int:
        return self.steps


class DyLU(LocalSteps):
    """Dynamic Local Updates: slower workers get fewer steps, so jobs take the same time.

    From Liu et al. 2024, https://arxiv.org/abs/2401.09135: every worker's job
    then takes about as long as the fastest worker's H steps.

        H_w = max(1, round(v_w / max_w' v_w' · H)),   v = steps per second

    Speeds come from the workers' profiles (nominal seconds per step). Rounded to
    the nearest step, so a job lands within half a step of the target time, early
    or late; the paper's floor (``dylu-floor``) always lands early, up to a whole
    step: at H = 20 on the 8-worker ``very`` fleet its jobs take 14.4-20 s, nearest's
    18.6-21.6 s, and jobs handed out together are meant to finish together
    (fedlm/engine/grace.py).
    """

    name = "dylu"
    even_times = True

    def speeds(self) -> list[float]:
        return [1.0 / t for t in self.step_times]

    def local_steps(self, worker: int) -> int:
        v = self.speeds()
        return max(1, self.round(v[worker] / max(v) * self.steps))

    @staticmethod
    def round(x: float) -> int:
        return math.floor(x + 0.5)  # half up, not Python's half-to-even


class DyLUFloor(DyLU):
    """DyLU with the paper's floor: H_w = max(1, floor(v_w / max v · H))."""

    name = "dylu-floor"

    @staticmethod
    def round(x: float) -> int:
        return math.floor(x + 1e-9)  # 20.0 computed as 19.999... is still 20


class DyLUOnline(DyLU):
    """DyLU with speeds estimated from observed compute times.

    Each worker's seconds per step is the median of its last ``window``
    observations, so one slow job (a hiccup) does not shrink its H, and one
    slow worker's hiccup does not shrink everyone else's (the max speed is a
    median too). A worker not yet observed is assumed as fast as the fastest
    observed one, so it starts with the full H.
    """

    name = "dylu-online"
    window = 5

    def start(self, *, steps: int, step_times: list[float]) -> None:
        super().start(steps=steps, step_times=step_times)
        self.observed: list[list[float]] = [[] for _ in step_times]

    def observe(self, worker: int, *, steps: int, seconds: float) -> None:
        if steps > 0 and seconds > 0:
            hist = self.observed[worker]
            hist.append(seconds / steps)
            del hist[:-self.window]

    def speeds(self) -> list[float]:
        known = [1.0 / statistics.median(h) for h in self.observed if h]
        fastest = max(known) if known else 1.0
        return [1.0 / statistics.median(h) if h else fastest for h in self.observed]
