"""FedScale-format traces (fedlm.sim.traces, docs/traces.md): files written by hand in
FedScale's format, the absences against FedScale's is_active rule, the unpickler that
builds no class, one-line refusals, seeded generators and ``fedlm trace``."""

from __future__ import annotations

import collections
import json
import math
import os
import pickle
import subprocess
import sys
from itertools import islice, takewhile
from pathlib import Path

import numpy as np
import pytest

from fedlm.errors import ConfigError
from fedlm.sim import traces
from tests._cli import assert_refused, run_cli

ROOT = Path(__file__).resolve().parent.parent

# A device trace as FedScale's client_device_capacity holds it, as JSON (ids as strings)
DEVICE_JSON = """{"10": {"computation": 150.5, "communication": 800},
                  "2": {"computation": 20, "communication": 25000.0},
                  "1": {"computation": 63.0, "communication": 4096}}"""

# An availability trace as FedScale's client_behave_trace pickle holds it (int ids)
P = 10000.0
BEHAVE = {
    1: {"active": [0, 3000], "inactive": [1000, 10000], "finish_time": 10000},  # wraps
    2: {"active": [2000], "inactive": [4000], "finish_time": 10000, "duration": 2000},
    3: {"active": [], "inactive": [], "finish_time": 10000},  # never there
    4: {"active": [5000], "inactive": [10000], "finish_time": 10000},  # ends at the period
    5: {"active": [0], "inactive": [10000], "finish_time": 10000},  # always there
    6: {"active": [100, 200, 250], "inactive": [100, 260, 400], "finish_time": 10000},
}


def _first(entry, n=3, scale=1.0):
    return list(islice(entry.absences(scale), n))


@pytest.fixture(name="behave")
def behave_fixture(tmp_path):
    path = tmp_path / "client_behave_trace"
    path.write_bytes(pickle.dumps(BEHAVE))
    return {e.key: e for e in traces.load_availability_trace(path)}


def test_a_device_trace_by_hand_in_key_order_with_fedscales_times(tmp_path):
    (path := tmp_path / "device.json").write_text(DEVICE_JSON)
    entries = traces.load_device_trace(path)
    assert [e.key for e in entries] == ["1", "2", "10"]  # numerically, not "1", "10", "2"
    e = entries[0]
    assert (e.computation, e.communication) == (63.0, 4096.0)
    # FedScale's get_completion_time for one step of a batch of 8, and its transfers
    assert e.step_seconds(8) == pytest.approx(3.0 * 8 * 1 * 63.0 / 1000.0)
    model_bytes = 1_000_000
    kbit = model_bytes / 1024 * 8  # FedScale's model size
    assert 2 * model_bytes / e.bytes_per_second() == pytest.approx((kbit + kbit) / 4096)
    assert traces.load_trace(path)[0] == "device"
    # ids that are not integers sort as strings, after those that are
    (path := tmp_path / "d.json").write_text(json.dumps(
        {k: {"computation": 1, "communication": 1} for k in ("b", "10", "a", "2")}))
    assert [e.key for e in traces.load_device_trace(path)] == ["2", "10", "a", "b"]


def test_an_availability_pickle_by_hand(tmp_path):
    (tmp_path / "t").write_bytes(pickle.dumps(BEHAVE))
    kind, entries = traces.load_trace(tmp_path / "t")  # the kind told by its keys
    assert kind == "availability" and [e.key for e in entries] == list("123456")
    behave = {e.key: e for e in entries}
    # a window ending at finish_time and one starting at 0 are one stay across the wrap
    assert _first(behave["1"]) == [(1000, 3000), (11000, 13000), (21000, 23000)]
    # the gap after the window and the next period's gap before it: one absence
    assert _first(behave["2"]) == [(0, 2000), (4000, 12000), (14000, 22000)]
    assert _first(behave["3"]) == [(0.0, math.inf)]
    assert _first(behave["4"]) == [(0, 5000), (10000, 15000), (20000, 25000)]
    assert _first(behave["5"]) == []
    # a zero-length window is no presence; overlapping ones are one
    assert _first(behave["6"]) == [(0, 200), (400, 10200), (10400, 20200)]


def _fedscale_in_time_order(trace: dict, times) -> list[bool]:
    """FedScale's ClientMetadata.is_active as FedScale calls it, with its behaviour
    index carried from call to call (times must increase)."""
    out, index = [], 0
    for t in times:
        norm = t % trace["finish_time"]
        if norm > trace["inactive"][index]:
            index += 1
        index %= len(trace["active"])
        out.append(trace["active"][index] <= norm <= trace["inactive"][index])
    return out


@pytest.mark.parametrize("key", [1, 2, 3, 4, 5, 6])
def test_absences_are_the_complement_of_fedscales_rule_on_a_grid(behave, key):
    entry, horizon = behave[str(key)], 3.5 * P
    grid = np.arange(0.0, horizon, 50.0)  # lands on every bound, and between them
    spans = list(takewhile(lambda s: s[0] < horizon, entry.absences()))
    bounds = {x for s in spans for x in s}
    for t in grid:
        inside = any(a < t < b for a, b in spans)
        if t in bounds:  # an instant between an absence and a window
            continue
        if key == 6 and t % P == 100:  # the zero-length window: FedScale's instant
            assert entry.active_at(t) and inside
            continue
        assert entry.active_at(t) == (not inside), (key, t)
    # FedScale's own stateful walk agrees, where it can: its index moves on only when
    # t % finish_time passes a window's end, so after a window that ends at finish_time
    # (client 1) it never comes back to the first window (docs/traces.md)
    if key in (2, 4, 5):
        assert _fedscale_in_time_order(BEHAVE[key], grid) == [entry.active_at(t) for t in grid]


def test_fedscales_bounds_are_inclusive_and_the_period_wraps(behave):
    two, four = behave["2"], behave["4"]
    assert two.active_at(2000) and two.active_at(4000) and not two.active_at(4000.5)
    assert two.active_at(12000) and not two.active_at(10000)
    # t % finish_time is never finish_time: a window ending there is open at the wrap
    assert four.active_at(9999.5) and not four.active_at(10000) and four.active_at(15000)


def test_trace_time_scale_stretches_the_timeline(behave):
    two = behave["2"]
    assert _first(two, scale=0.5) == [(0, 1000), (2000, 6000), (7000, 11000)]
    for t in np.arange(0.0, 30000.0, 37.0):
        assert two.active_at(t, 2.0) == two.active_at(t / 2.0)
    with pytest.raises(ConfigError, match="trace_time_scale"):
        next(two.absences(0.0))


_ran: list[str] = []


def _record(what: str) -> None:
    _ran.append(what)


class _Gadget:
    def __reduce__(self):  # unpickling calls _record: code the file chose
        return (_record, ("the pickle ran code",))


@pytest.mark.parametrize("payload, named", [
    (collections.OrderedDict([(1, {"computation": 1, "communication": 1})]),
     "collections.OrderedDict"),
    ({1: _Gadget()}, "_record'"),
    ({1: {"computation": np.float64(5.0), "communication": 1.0}}, "numpy"),
])
def test_a_pickle_that_asks_for_a_class_is_refused(tmp_path, payload, named):
    (path := tmp_path / "t.pkl").write_bytes(pickle.dumps(payload))
    with pytest.raises(ConfigError) as err:
        traces.load_device_trace(path)
    message = str(err.value)
    assert "not a plain FedScale trace" in message and named in message
    assert len(message.splitlines()) == 1 and message.startswith(str(path))
    assert _ran == []


DEVICE_BAD = [
    ("[1, 2]", "holds a list, not a dict of clients"),
    ("{}", "holds no clients"),
    ('{"1": 5}', "client 1 is 5, not a dict"),
    ('{"1": {"computation": 5}}', "client 1 has no 'communication'"),
    ('{"1": {"computation": "fast", "communication": 5}}',
     "client 1's 'computation' is 'fast', not a finite number >= 0"),
    ('{"1": {"computation": NaN, "communication": 5}}', "'computation' is nan"),
    ('{"1": {"computation": 1, "communication": -5}}', "'communication' is -5, not a finite"),
    ('{"1": {"computation": 1, "communication": 0}}', "'communication' is 0, not a finite n"),
    ('{"1": {"computation": 1e999, "communication": 1}}', "'computation' is inf"),
    ('{"1": {"computation": true, "communication": 1}}', "'computation' is True"),
    ('{"1": {"active": [], "inactive": [], "finish_time": 1}}', "has no 'computation'"),
    ("not a trace", "neither JSON nor a pickle"),
]
AVAILABILITY_BAD = [
    ({"active": [1], "inactive": [], "finish_time": 9}, "1 'active' but 0 'inactive'"),
    ({"active": [5], "inactive": [4], "finish_time": 9}, "window 0 [5, 4] is not inside"),
    ({"active": [5], "inactive": [10], "finish_time": 9}, "[0, finish_time 9]"),
    ({"active": [5, 1], "inactive": [6, 2], "finish_time": 9}, "windows not sorted"),
    ({"active": [1], "inactive": [2], "finish_time": 0}, "'finish_time' is 0"),
    ({"active": 1, "inactive": [2], "finish_time": 9}, "'active' is 1, not a list"),
    ({"active": [1], "finish_time": 9}, "has no 'inactive'"),
    ({"active": [-1], "inactive": [2], "finish_time": 9}, "'active'[0] is -1"),
]


@pytest.mark.parametrize("text, fragment", DEVICE_BAD, ids=[f for _, f in DEVICE_BAD])
def test_a_malformed_device_trace_is_one_line_naming_file_and_client(tmp_path, text, fragment):
    (path := tmp_path / "device.json").write_text(text)
    with pytest.raises(ConfigError) as err:
        traces.load_device_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and fragment in message, message
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize("client, fragment", AVAILABILITY_BAD,
                         ids=[f for _, f in AVAILABILITY_BAD])
def test_a_malformed_availability_trace_is_one_line(tmp_path, client, fragment):
    (path := tmp_path / "behave.pkl").write_bytes(pickle.dumps({7: client}))
    with pytest.raises(ConfigError) as err:
        traces.load_availability_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}: client 7") and fragment in message, message
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize("fmt", traces.FORMATS)
@pytest.mark.parametrize("kind", ["device", "availability"])
def test_generators_are_seeded_and_write_fedscales_format(tmp_path, fmt, kind):
    gen = traces.generate_device if kind == "device" else traces.generate_availability

    def write(seed: int, name: str) -> bytes:
        traces.write_trace(tmp_path / name, gen(50, seed), fmt)
        return (tmp_path / name).read_bytes()

    assert write(3, "a") == write(3, "b") != write(4, "c")
    raw = pickle.loads(write(3, "a")) if fmt == "pickle" else json.loads(write(3, "a"))
    keys = ({"computation", "communication"} if kind == "device"
            else {"active", "inactive", "finish_time"})
    assert len(raw) == 50 and all(set(v) == keys for v in raw.values())
    found, entries = traces.load_trace(tmp_path / "a")
    assert found == kind and [e.key for e in entries] == [str(i) for i in range(1, 51)]
    if kind == "device":
        comp = [e.computation for e in entries]
        comm = [e.communication for e in entries]
        assert 30 < np.median(comp) < 120 and 2000 < np.median(comm) < 20000
    else:
        assert all(e.finish_time == traces.FINISH_TIME for e in entries)
        frac = np.mean([sum(b - a for a, b in e.windows()) / e.finish_time for e in entries])
        per_day = np.mean([len(e.windows()) for e in entries]) / 6
        assert 0.05 < frac < 0.4 and 1 < per_day < 5  # a few windows, hours a day


def test_a_generated_trace_agrees_with_fedscales_rule():
    for e in traces.availability_entries(
            {str(k): v for k, v in traces.generate_availability(5, 0).items()}, "gen"):
        spans = list(takewhile(lambda s: s[0] < 2 * traces.FINISH_TIME, e.absences()))
        for t in np.arange(0.5, 2 * traces.FINISH_TIME, 97.0):  # never on a whole second
            assert e.active_at(t) == (not any(a < t < b for a, b in spans))


def test_bad_generator_arguments_and_formats():
    for call, fragment in [(lambda: traces.generate_device(0, 1), "clients: 0"),
                           (lambda: traces.generate_device(3, -1), "seed: -1"),
                           (lambda: traces.generate_availability(3, 1, 0.0), "period is 0.0"),
                           (lambda: traces.write_trace("x", {1: {}}, "csv"), "'csv'")]:
        with pytest.raises(ConfigError, match=fragment):
            call()


def _fedlm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedlm", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_fedlm_trace_end_to_end(tmp_path):
    out = _fedlm("trace", "availability", "--clients", "20", "--seed", "1", "--out",
                 "t/behave.pkl", "--period", "86400", cwd=tmp_path)
    assert out.returncode == 0 and out.stderr == "", out
    assert out.stdout.startswith("wrote t/behave.pkl (pickle): availability trace of 20 "
                                 "clients over 86,400 s") and out.stdout.count("\n") == 1
    entries = traces.load_availability_trace(tmp_path / "t" / "behave.pkl")
    assert len(entries) == 20 and entries[0].finish_time == 86400
    out = _fedlm("trace", "show", "t/behave.pkl", cwd=tmp_path)
    assert out.returncode == 0 and "availability trace: 20 clients" in out.stdout, out
    out = _fedlm("trace", "device", "--clients", "5", "--seed", "1", "--out", "d.json",
                 "--format", "pickle", cwd=tmp_path)
    assert out.returncode == 0 and "device trace of 5 clients" in out.stdout, out
    assert pickle.loads((tmp_path / "d.json").read_bytes())[1]["computation"] > 0
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps(collections.OrderedDict()))
    out = _fedlm("trace", "show", "evil.pkl", cwd=tmp_path)  # refused in one line
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.startswith("fedlm: error: evil.pkl: not a plain FedScale trace")
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


@pytest.mark.parametrize("argv, fragment", [
    (["trace", "device", "--clients", "0", "--seed", "1", "--out", "x"], "--clients"),
    (["trace", "device", "--clients", "2", "--seed", "x", "--out", "x"], "--seed"),
    (["trace", "device", "--clients", "2", "--seed", "1", "--out", ""], "--out"),
    (["trace", "availability", "--clients", "2", "--seed", "1", "--out", "x", "--period",
      "nan"], "--period"),
    (["trace", "availability", "--clients", "2", "--seed", "1", "--out", "x", "--period",
      "1e12"], "more than 10 years"),
    (["trace", "show", "missing.json"], "missing.json: cannot read the trace (No such file"),
    (["trace"], "action"),
])
def test_bad_trace_arguments(tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    assert_refused(*run_cli(argv), fragment)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("active, inactive, scale", [
    ((1e-208,), (900.0,), 1.0),  # the window runs to the wrap: an empty gap each period
    ((0.0,), (900.0 - 1e-13,), 1.0),  # a gap that the period's offset soon swallows
])
def test_empty_gaps_end_the_absences(active, inactive, scale):
    """Gaps of no length are no absences: the stream ends once a period yields none, so
    a reader looking for the next absence stops (it used to spin for ever, deaf to
    SIGTERM)."""
    entry = traces.AvailabilityEntry("1", active, inactive, 900.0)
    spans = list(islice(entry.absences(scale), 10_000_000))  # ends by itself
    assert len(spans) < 10_000_000 and all(e > s for s, e in spans)
    assert spans == sorted(spans)


def test_a_run_on_a_trace_whose_window_ends_at_the_wrap_finishes(tmp_path):
    from collections import OrderedDict

    import torch

    from fedlm.engine.dry_run import run_clock
    from tests.conftest import tiny_config

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"1": {"active": [1e-208], "inactive": [900],
                                      "finish_time": 900}}))
    cfg = tiny_config(f"fleet.availability_trace={path}", "updates=3", "inner.steps=2")
    engine, _ = run_clock(cfg, OrderedDict(w=torch.zeros(4)))
    assert engine.version == 3
