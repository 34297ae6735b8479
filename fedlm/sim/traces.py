"""FedScale-format traces (docs/traces.md): each client's speed and link, and when it
is there. FedScale drives its simulated fleet with two pickles of plain dicts keyed by
client id; fedlm reads the same files, or the same dicts as JSON:

    device        {id: {'computation': ms per sample (inference), 'communication': kbit/s}}
    availability  {id: {'active': [starts], 'inactive': [ends], 'finish_time': period}}

Pickles are read by an unpickler that builds no class at all (FedScale's traces hold
only dicts, lists, numbers and strings; a pickle naming a class could run any code).
A refusal is one ``ConfigError`` line naming the file and the client. Numpy only.
"""

from __future__ import annotations

import itertools
import json
import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from fedlm.errors import ConfigError, shown, shown_key
from fedlm.sim.trace_files import read_trace

AUGMENTATION = 3.0  # FedScale's augmentation_factor: forward + backward ~ 3 x inference
KBIT_BYTES = 1024 / 8  # bytes in one of FedScale's kbit (it counts bytes / 1024 * 8)
FINISH_TIME = 518400.0  # FedScale's availability period: 6 days, in seconds
DAY, HOUR = 86400.0, 3600.0
FORMATS = ("json", "pickle")
Span = tuple[float, float]


@dataclass(frozen=True)
class DeviceEntry:
    """One client of a device trace."""

    key: str
    computation: float  # ms per sample, inference latency
    communication: float  # kbit/s, both ways

    def step_seconds(self, batch_size: int) -> float:
        """One inner step of ``batch_size`` samples by FedScale's completion time:
        3.0 x batch x ms per sample / 1000 (the backward pass ~ twice the forward)."""
        return AUGMENTATION * batch_size * self.computation / 1000.0

    def bytes_per_second(self) -> float:
        return self.communication * KBIT_BYTES


@dataclass(frozen=True)
class AvailabilityEntry:
    """One client of an availability trace: its windows in one period, in trace seconds."""

    key: str
    active: tuple[float, ...]
    inactive: tuple[float, ...]
    finish_time: float

    def __post_init__(self) -> None:
        a, b, p = self.active, self.inactive, self.finish_time
        _number(f"client {self.key}", "finish_time", p, positive=True)
        if len(a) != len(b):
            raise ConfigError(f"client {self.key}: {len(a)} 'active' but {len(b)} 'inactive'")
        for i, (s, e) in enumerate(zip(a, b)):
            if not 0 <= s <= e <= p:
                raise ConfigError(f"client {self.key}: window {i} [{s:g}, {e:g}] is not "
                                  f"inside [0, finish_time {p:g}] with start <= end")
            if i and s < a[i - 1]:
                raise ConfigError(f"client {self.key}: windows not sorted ({i} starts first)")

    def windows(self) -> list[Span]:
        """One period's windows, overlapping or touching ones joined; a window of zero
        length (an instant of presence, in which no job can start) is none."""
        return _joined(zip(self.active, self.inactive))

    def active_at(self, t: float, scale: float = 1.0) -> bool:
        """FedScale's ``is_active`` at run second ``t`` (trace times x ``scale``):
        ``active[i] <= t % finish_time <= inactive[i]`` for some i."""
        norm = t % (self.finish_time * _number("fleet", "trace_time_scale", scale, True))
        return any(s * scale <= norm <= e * scale for s, e in zip(self.active, self.inactive))

    def absences(self, scale: float = 1.0) -> Iterator[Span]:
        """The absences (start, end) in run seconds from 0 (trace seconds x ``scale``) in
        time order over the trace repeated forever, joined across the wrap; (0, inf) if
        it is never there. Absent strictly inside them, present strictly inside the
        windows; at the instants between, FedScale's inclusive bounds decide."""
        p = self.finish_time * _number("fleet", "trace_time_scale", scale, True)
        wins = [(s * scale, e * scale) for s, e in self.windows()]
        if not wins:
            yield (0.0, math.inf)
            return
        gaps = [(wins[i][1], wins[i + 1][0]) for i in range(len(wins) - 1)]
        first, last = wins[0][0], wins[-1][1]
        if not (first == 0 and last == p):  # else a window runs on across the wrap
            gaps.append((last, p + first))  # this period's last gap and the next's first
        if not gaps:
            return  # always there
        if first > 0:
            yield (0.0, first)  # the run starts in the previous period's last gap
        for k in itertools.count():
            # A gap too short to survive the addition is no absence; and since the
            # offset only grows, a period of none means none for ever (no endless
            # stream of empty gaps that a reader would skip for ever).
            spans = [(k * p + s, k * p + e) for s, e in gaps if k * p + s < k * p + e]
            if not spans:
                return
            yield from spans


def _joined(spans: Iterable[Span]) -> list[Span]:
    """The spans of positive length, sorted, overlapping or touching ones joined."""
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if e > s and out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        elif e > s:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _entries(data: dict[str, Any], where: str) -> tuple[str, list]:
    """('device' or 'availability', the entries), the kind told by the first client's keys."""
    key, first = next(iter(data.items()))
    if isinstance(first, dict) and "computation" in first:
        return "device", device_entries(data, where)
    if isinstance(first, dict) and "active" in first:
        return "availability", availability_entries(data, where)
    raise ConfigError(f"{where}: client {shown_key(key)} holds neither 'computation' (a "
                      f"device trace) nor 'active' (an availability trace)")


def _fields(where: str, key: str, value: Any, names: tuple[str, ...]) -> list:
    missing = [n for n in names if n not in value] if isinstance(value, dict) else None
    if missing != []:
        why = f"is {shown(value, 60)}, not a dict" if missing is None else f"has no {missing[0]!r}"
        raise ConfigError(f"{where}: client {shown_key(key)} {why}")
    return [value[name] for name in names]


def _number(where: str, what: str, value: Any, positive: bool = False) -> float:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    x = float(value) if number and abs(value) < 1e308 else math.nan  # no OverflowError
    if not (x > 0 if positive else x >= 0):
        raise ConfigError(f"{where}: {what} is {shown(value, 60)}, not a finite number "
                          f"{'> 0' if positive else '>= 0'}")
    return x


def device_entries(data: dict[str, Any], where: str) -> list[DeviceEntry]:
    out = []
    for key, value in data.items():
        comp, comm = _fields(where, key, value, ("computation", "communication"))
        who = f"client {shown_key(key)}"
        out.append(DeviceEntry(key, _number(where, f"{who}'s 'computation'", comp),
                               _number(where, f"{who}'s 'communication'", comm, True)))
    return out


def availability_entries(data: dict[str, Any], where: str) -> list[AvailabilityEntry]:
    out = []
    for key, value in data.items():
        active, inactive, finish = _fields(where, key, value,
                                           ("active", "inactive", "finish_time"))
        who = f"client {shown_key(key)}"
        times = []
        for name, seq in (("active", active), ("inactive", inactive)):
            if not isinstance(seq, (list, tuple)):
                raise ConfigError(f"{where}: {who}'s {name!r} is {shown(seq, 60)}, not a list")
            times.append(tuple(_number(where, f"{who}'s {name!r}[{i}]", x)
                               for i, x in enumerate(seq)))
        period = _number(where, f"{who}'s 'finish_time'", finish, True)
        try:
            out.append(AvailabilityEntry(key, times[0], times[1], period))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return out


def load_device_trace(path: str | Path) -> list[DeviceEntry]:
    return device_entries(read_trace(path), shown_key(str(path)))


def load_availability_trace(path: str | Path) -> list[AvailabilityEntry]:
    return availability_entries(read_trace(path), shown_key(str(path)))


def load_trace(path: str | Path) -> tuple[str, list]:
    """(kind, entries) of a trace of either kind, told apart by its keys."""
    return _entries(read_trace(path), shown_key(str(path)))


def write_trace(path: str | Path, data: dict, fmt: str) -> None:
    """``data``, checked as fedlm reads it, as JSON or a pickle (protocol 4: FedScale's
    Python 3 reads it; the bytes do not change with Python's default protocol)."""
    if fmt not in FORMATS:
        raise ConfigError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}")
    where = shown_key(str(path))
    text = {str(k): v for k, v in data.items()}
    if not text:
        raise ConfigError(f"{where}: a trace needs at least one client")
    _entries(text, where)
    blob = (json.dumps(data, indent=1).encode() + b"\n" if fmt == "json"
            else pickle.dumps(data, protocol=4))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(blob)


def _generator(clients: int, seed: int, stream: int) -> np.random.Generator:
    for name, value, low in (("clients", clients, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name}: {shown(value)} is not an integer >= {low}")
    return np.random.default_rng([seed, stream])


def generate_device(clients: int, seed: int) -> dict[int, dict[str, float]]:
    """A device trace in FedScale's format, ids 1..clients. Inference latency lognormal,
    median 60 ms/sample (90% within ~19-190, clipped to 5-1000: a small model on phones
    from flagship to old); bandwidth lognormal, median 7,000 kbit/s (90% within
    ~1,400-36,000, clipped to 100-200,000: 3G to Wi-Fi)."""
    rng = _generator(clients, seed, 7340033)
    comp = np.clip(rng.lognormal(math.log(60.0), 0.7, clients), 5.0, 1000.0)
    comm = np.clip(rng.lognormal(math.log(7000.0), 1.0, clients), 100.0, 200000.0)
    return {i + 1: {"computation": round(float(comp[i]), 3),
                    "communication": round(float(comm[i]), 3)} for i in range(clients)}


def generate_availability(clients: int, seed: int, period: float = FINISH_TIME
                          ) -> dict[int, dict[str, Any]]:
    """An availability trace in FedScale's format, ids 1..clients, whole seconds. Each
    client has a clock offset (time zone, habit: normal, sd 3 h); each day it charges
    overnight with probability 0.8 (from ~23:00, sd 1.5 h, lognormal median 3 h, at most
    10 h) and is there Poisson(1.5) more times in 07:00-22:00 (lognormal median 20 min,
    2 min to 2 h). Windows are cut at [0, period], joined where they overlap, sorted."""
    rng = _generator(clients, seed, 9437189)
    if not _number("availability", "period", period, True) <= 3650 * DAY:
        raise ConfigError(f"period: {shown(period)} seconds is more than 10 years")
    period = float(period)
    days = np.arange(-1, math.ceil(period / DAY) + 1) * DAY  # each day's midnight
    out: dict[int, dict[str, Any]] = {}
    for c in range(clients):
        base = days + rng.normal(0.0, 3 * HOUR)
        night = (base + rng.normal(23 * HOUR, 1.5 * HOUR, len(days)))[rng.random(len(days)) < 0.8]
        counts = rng.poisson(1.5, len(days))
        day = np.repeat(base, counts) + rng.uniform(7 * HOUR, 22 * HOUR, counts.sum())
        starts = np.concatenate([night, day])
        ends = starts + np.concatenate([
            np.minimum(rng.lognormal(math.log(3 * HOUR), 0.4, len(night)), 10 * HOUR),
            np.clip(rng.lognormal(math.log(1200.0), 0.8, len(day)), 120.0, 2 * HOUR)])
        wins = _joined(zip(*np.clip(np.round([starts, ends]), 0.0, period).tolist()))
        out[c + 1] = {"active": [s for s, _ in wins], "inactive": [e for _, e in wins],
                      "finish_time": period}
    return out
