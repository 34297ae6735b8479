"""What the fuzz suites share: a time bound that holds while an example runs, and the
seed of this suite's random round.

- ``time_bound(seconds)``: SIGALRM interrupts an example that runs too long, wherever it
  is (a pure-Python loop that never returns included), and fails it with one line. A
  bound checked only after an example returns never fires on one that spins.
- ``SEED`` / ``RANDOM``: the fixed examples (``derandomize``) repeat every run; each
  suite also has a random round, ``RANDOM`` settings under ``@seed(SEED)``. The seed
  is new each run (``pytest_configure`` draws it and puts it in the environment, so
  xdist's workers share it) and printed in the report's header: ``FEDLM_FUZZ_SEED=N``
  reproduces a failure.
"""

from __future__ import annotations

import os
import secrets
import signal
from contextlib import contextmanager
from typing import Iterator

from hypothesis import HealthCheck, settings

SEED_VARIABLE = "FEDLM_FUZZ_SEED"


class ExampleTimedOut(AssertionError):
    """An example ran past its time bound."""


def draw_seed() -> int:
    """This run's random-round seed: the environment's, or a new one put there."""
    if not os.environ.get(SEED_VARIABLE, "").strip().isdigit():
        os.environ[SEED_VARIABLE] = str(secrets.randbits(32))
    return int(os.environ[SEED_VARIABLE])


SEED = draw_seed()
RANDOM = settings(max_examples=int(os.environ.get("FEDLM_FUZZ_RANDOM_EXAMPLES", "25")),
                  deadline=None, database=None, derandomize=False,
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow])


@contextmanager
def time_bound(seconds: float) -> Iterator[None]:
    """Fail the block with ``ExampleTimedOut`` once it has run ``seconds`` (main thread
    only: that is where Python runs signal handlers)."""
    def expired(signum, frame):
        raise ExampleTimedOut(f"an example ran past its bound of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
