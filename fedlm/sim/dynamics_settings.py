"""The settings of a fleet that changes over time (``fleet.slowdown``, ``fleet.stragglers``,
``fleet.availability``, ``fleet.join``, ``fleet.leave``, an availability trace): their
defaults, how each is read (every number checked), the refusals of a config whose
settings make no sense or let no job finish, and the words and tags that name such a
fleet in a run's name and first line.

These read a config only; what the settings do to a run, worker by worker over virtual
time, is ``fedlm.sim.dynamics``. Apart so that a config's checks
(``fedlm.sim.fleet_check``) need neither the draws nor numpy.
"""

from __future__ import annotations

from typing import Any

from fedlm.errors import ConfigError
from fedlm.sim import quantities as Q

SLOWDOWN_KEYS = {"factor": 4.0, "normal": 3600.0, "slow": 600.0}
STRAGGLER_KEYS = {"p": 0.05, "factor": 5.0, "alpha": 1.5, "max": 100.0}
AVAILABILITY_KEYS = {"up": 3600.0, "down": 600.0}
_WHO = ("workers", "regions")  # which workers a process applies to (empty: all)


def read_settings(path: str, raw: dict[str, Any], defaults: dict[str, float],
                  factor: Q.Quantity = Q.FACTOR) -> dict[str, Any]:
    """``raw`` with its defaults filled in, every number checked (``fedlm.sim.quantities``:
    times, probabilities, factors in their ranges; ``factor`` says which kind of factor)."""
    known = {*defaults, *_WHO}
    out: dict[str, Any] = dict(defaults)
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"{path}.{key}: unknown key (known: {', '.join(sorted(known))})")
        if key in _WHO:
            if not isinstance(value, list):
                raise ConfigError(f"{path}.{key}: expected a list, got {value!r}")
            out[key] = list(value)
            continue
        out[key] = {**_QUANTITY, "factor": factor}[key].check(f"{path}.{key}", value)
    return out


# what each setting of a process is (fedlm.sim.quantities: one range, one wording)
_QUANTITY = {"normal": Q.DURATION, "slow": Q.DURATION, "up": Q.DURATION, "down": Q.DURATION,
             "p": Q.PROBABILITY, "alpha": Q.PARETO_SHAPE, "max": Q.FACTOR}


def check(fleet_cfg: Any, num_workers: int, regions: list[str]) -> None:
    """Refuse a setting of this module that makes no sense, in one line."""
    f = fleet_cfg
    if f.slowdown:
        s = read_settings("fleet.slowdown", f.slowdown, SLOWDOWN_KEYS, factor=Q.SLOWER)
        _check_who("fleet.slowdown", s, num_workers, regions)
    if f.stragglers:
        s = read_settings("fleet.stragglers", f.stragglers, STRAGGLER_KEYS, factor=Q.FACTOR)
        if s["max"] < s["factor"]:
            raise ConfigError(f"fleet.stragglers: need 1 <= factor <= max, got factor "
                              f"{s['factor']!r}, max {s['max']!r}")
        _check_who("fleet.stragglers", s, num_workers, regions)
    if f.availability:
        _check_who("fleet.availability",
                   read_settings("fleet.availability", f.availability, AVAILABILITY_KEYS),
                   num_workers, regions)
    for name in ("join", "leave"):
        times = getattr(f, name)
        if len(times) > num_workers:
            raise ConfigError(f"fleet.{name}: {len(times)} times for {num_workers} workers")
        Q.check_all(f"fleet.{name}", times, Q.TIME)  # leave: 0 is never
    for k in range(min(len(f.join), len(f.leave))):
        if 0 < f.leave[k] <= f.join[k]:
            raise ConfigError(f"fleet.leave[{k}]: {f.leave[k]!r} is not after its join "
                              f"time {f.join[k]!r}")
    Q.TIME_SCALE.check("fleet.trace_time_scale", f.trace_time_scale)


def _check_who(path: str, s: dict[str, Any], num_workers: int, regions: list[str]) -> None:
    for w in s.get("workers", []):
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < num_workers:
            raise ConfigError(f"{path}.workers: {w!r} is not a worker (0-{num_workers - 1})")
    for r in s.get("regions", []):
        if r not in regions:
            raise ConfigError(f"{path}.regions: no worker is in region {r!r} "
                              f"(regions: {', '.join(sorted(set(regions)))})")


# A presence process whose mean window is this many times shorter than the shortest job
# lets a job finish once in e^13.8 ~ a million tries: none, in practice.
NO_FIT_RATIO = 13.8


def no_job_fits(fleet_cfg: Any, shortest_job: list[float], windows: dict | None = None
                ) -> str | None:
    """Why no worker's job can ever finish inside its presence (one line), or None.

    ``shortest_job`` gives each worker's shortest possible job in seconds (its compute
    alone is a lower bound); ``windows`` maps an availability trace's workers to their
    longest window in run seconds (``longest_windows``). The seeded process of
    ``fleet.availability`` draws exponential windows of mean ``up``: refused only where
    even the shortest job is ``NO_FIT_RATIO`` means long."""
    f = fleet_cfg
    if f.availability:
        up = float(f.availability.get("up", AVAILABILITY_KEYS["up"]))
        if all(t > NO_FIT_RATIO * up for t in shortest_job):
            return (f"fleet.availability.up: windows of mean {up:g} s, and every job takes "
                    f"at least {min(shortest_job):g} s: no job can finish (fewer than one in "
                    f"a million)")
    if windows:
        if all(windows[w] < shortest_job[w] for w in windows):
            longest = max(windows.values())
            return (f"fleet.availability_trace: its longest window is {longest:g} s (trace "
                    f"time x fleet.trace_time_scale {f.trace_time_scale:g}), and every job "
                    f"takes at least {min(shortest_job):g} s: no job can finish")
    return None


def longest_windows(entries: list, workers: int, scale: float) -> dict[int, float]:
    """Each worker's longest presence in run seconds under an availability trace (worker
    w is the trace's (w mod clients)-th client, as for devices)."""
    longest = [max((e - s for s, e in c.windows()), default=0.0) * scale for c in entries]
    return {w: longest[w % len(entries)] for w in range(workers)}


def features(fleet_cfg: Any) -> list[tuple[str, str]]:
    """What makes this fleet other than its preset's steady one, as (short tag, words):
    a run's default name carries the tags (``diloco-moderate+availability-trace``) and
    ``fedlm run``'s first line the words, so a run on a trace is not named and announced
    as a plain one."""
    f = fleet_cfg
    out = []
    if f.device_trace:
        out.append(("device-trace", f"device trace {f.device_trace}"))
    if f.availability_trace:
        out.append(("availability-trace", f"availability trace {f.availability_trace} x "
                                          f"{f.trace_time_scale:g}"))
    if f.availability:
        out.append(("availability", "absences"))
    if any(t > 0 for t in f.join) or any(t > 0 for t in f.leave):
        out.append(("join-leave", "joins and leaves"))
    if f.slowdown:
        out.append(("slowdown", "slow-downs"))
    if f.stragglers:
        out.append(("stragglers", "stragglers"))
    return out


def enabled(fleet_cfg: Any) -> bool:
    """Whether anything in the fleet changes over time."""
    f = fleet_cfg
    return bool(f.slowdown or f.stragglers or f.availability or f.availability_trace
                or any(t > 0 for t in f.join) or any(t > 0 for t in f.leave))
