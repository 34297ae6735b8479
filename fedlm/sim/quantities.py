"""One check of the physical quantities a simulated fleet is made of, wherever they come
from: the config (step times, links, the shared server link), a measured network, a
FedScale trace (ms per sample, kbit/s, availability windows), fleet dynamics (join and
leave times, presence windows, slow-downs, stragglers) and the planner.

Each kind of quantity has one stated range and one wording, so that a value outside it
is refused in the same one line whoever gave it:

    fleet.step_times[0]: must be seconds per inner step in (0, 1e+06], got -1.0

Past these ranges the virtual clock stops meaning anything (a 1e-300 byte/s link takes
1e297 s to cross; 1e308 s is inf once added to), or the draws overflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedlm.errors import ConfigError, shown

GBIT = 1e9 / 8  # bytes per second in one Gbit/s (as fedlm.sim.links.GBIT)


@dataclass(frozen=True)
class Quantity:
    noun: str  # "seconds per inner step"
    lo: float
    hi: float
    lo_open: bool = False  # (lo, hi] rather than [lo, hi]
    note: str = ""  # what the range means, in the message

    def rule(self) -> str:
        interval = f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"
        return f"{self.noun} in {interval}{self.note}"

    def ok(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        x = float(value) if abs(value) < 1e308 else math.inf  # ints past float: too big
        above_lo = x > self.lo if self.lo_open else x >= self.lo
        return math.isfinite(x) and above_lo and x <= self.hi

    def check(self, path: str, value: Any) -> float:
        """``value`` as a float, or a one-line ``ConfigError`` naming ``path``."""
        if not self.ok(value):
            raise ConfigError(f"{path}: must be {self.rule()}, got {shown(value, 60)}")
        return float(value)


STEP = Quantity("seconds per inner step", 1e-9, 1e6)
TIME = Quantity("a time in seconds", 0.0, 1e9, note=" (0: the start; 1e9 s is 31 years)")
DURATION = Quantity("a duration in seconds", 1e-6, 1e9)
LATENCY = Quantity("a latency in seconds", 0.0, 3600.0)
BANDWIDTH = Quantity("a bandwidth in bytes/s", 125.0, 1.25e14,
                     note=" (1 kbit/s to 1 Pbit/s)")
FACTOR = Quantity("a factor", 1.0, 1e6)
SLOWER = Quantity("a factor", 1.0, 1e6, lo_open=True, note=" (how many times slower)")
PARETO_SHAPE = Quantity("a Pareto shape", 0.01, 100.0)
TIME_SCALE = Quantity("a time scale", 1e-6, 1e6)
JITTER = Quantity("a lognormal sigma", 0.0, 10.0)
PROBABILITY = Quantity("a probability", 0.0, 1.0, lo_open=True)
# a job's inner steps, as a policy derives them (fedlm.sim.job_sizes): a million steps of
# the smallest model take hours of a CPU core; more is a fleet no round can be sized for
JOB_STEPS = Quantity("inner steps of one job", 1, 1e6)
PAYLOAD = Quantity("bytes on the wire", 1.0, 1e15, note=" (a petabyte)")


def check_derived(path: str, source: str, value: float, quantity: Quantity) -> float:
    """``value``, derived from ``source`` (e.g. "'computation' 0 ms/sample"), as
    ``quantity``; else one line saying what it came from."""
    if not quantity.ok(value):
        raise ConfigError(f"{path}: {source} gives {shown(value, 60)}, which must be "
                          f"{quantity.rule()}")
    return float(value)


def check_all(path: str, values: list, quantity: Quantity) -> list[float]:
    """Each of ``values`` checked, named ``path[k]``."""
    return [quantity.check(f"{path}[{k}]", v) for k, v in enumerate(values)]
