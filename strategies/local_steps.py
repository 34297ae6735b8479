"""Local-steps policies: how many inner steps a worker's next job gets.

Chosen independently of the strategy (config key ``local_steps``). A policy
sees the worker's profile-derived speed and the configured H and returns an
int >= 1.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar


class LocalSteps(ABC):
    name: ClassVar[str] = ""

    def start(self, *, steps: int, step_times: list[float]) -> None:
        """``steps`` = configured H; ``step_times`` = nominal seconds per step per worker."""
        self.steps = steps
        self.step_times = list(step_times)

    @abstractmethod
    def local_steps(self, worker: int) -> int:
        """Inner steps for ``worker``'s next job."""

    def observe(self, worker: int, *, steps: int, seconds: float) -> None:
        """A job of ``steps`` steps took ``seconds`` of compute (for online estimates)."""


class Fixed(LocalSteps):
    """Every job runs the configured H steps."""

    name = "fixed"

    def local_steps(self, worker: int) -> int:
        return self.steps
