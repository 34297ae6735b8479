"""When a run has diverged: its validation loss is NaN or infinite, or more than
``eval.diverge_factor`` times the best it has reached (0: only non-finite).

The rule is on loss (mean cross-entropy, nats), not on perplexity: perplexity is
exp(loss), so a factor on it would be a constant added to the loss and mean
something else at every level of training. The engine asks at every evaluation
(``fedlm.engine.health``) and stops the run with ``Diverged`` and the message this
module writes: one line, with the version, the best so far and a hint.
"""

from __future__ import annotations

import math


def hint(name: str, lr) -> str:
    """What to try, for the message: a global model that blows up between outer
    steps is almost always an outer step too large for the strategy ``name`` (its outer
    learning rate ``lr``, where it has one)."""
    now = f" (now {lr:g})" if isinstance(lr, (int, float)) and not isinstance(lr, bool) else ""
    return (f"the outer learning rate is likely too high for {name}; try a smaller "
            f"outer.lr{now}")


class DivergenceWatch:
    """The best validation loss so far (and its version); ``check`` says whether a
    new evaluation means the run diverged."""

    def __init__(self, factor: float, hint: str) -> None:
        self.factor = factor
        self.hint = hint
        self.best: tuple[float, int] | None = None  # (loss, version), the earliest of ties

    def seed(self, loss: float, version: int) -> None:
        """A resumed run's best so far (the evaluations before its checkpoint)."""
        if self.best is None or loss < self.best[0]:
            self.best = (loss, version)

    def check(self, version: int, loss: float) -> str | None:
        """None if the run may go on (the best so far updated), else the one-line
        reason it diverged at ``version``."""
        if not math.isfinite(loss):
            if self.best is None:  # the first evaluation: nothing was ever trained
                return (f"validation loss is {loss} at version {version}, the first "
                        f"evaluation: the weights the run starts from are broken "
                        f"(init.from?)")
            return (f"validation loss is {loss} at version {version} (best "
                    f"{self.best[0]:.3g} at version {self.best[1]}): the global model has "
                    f"non-finite weights; {self.hint}")
        if self.best is not None and self.factor and loss > self.factor * self.best[0]:
            best, at = self.best
            times = f"{loss / best:.1f}x" if best > 0 else "far above"
            return (f"validation loss {loss:.3g} at version {version} is {times} its best "
                    f"({best:.3g} at version {at}): {self.hint}")
        self.seed(loss, version)
        return None
