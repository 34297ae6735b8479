"""Property-based fuzzing of the inputs added with fleets that change (hypothesis): trace
files (JSON, pickles, junk bytes), fleet dynamics and link quantities, and plug-in paths.

Properties, for every input:
- a clean refusal: ``ConfigError`` with one line; never another exception;
- or an accepted config whose quantities are in their stated ranges (no silent
  nonsense: finite, positive step times and bandwidths; times within bounds) and whose
  run (the engine's virtual clock alone, ``dry_run.run_clock``) finishes or stops with
  one line (``EngineError``: no progress), within a time bound per example.

Derandomized like tests/test_fuzz_config.py: CI tries the same examples every time
(FEDLM_FUZZ_RANDOM=1 explores new ones), and then a random round of trace files
seeded anew each run (tests/fuzzing.py: the seed is in the suite's last lines).
"""

from __future__ import annotations

import json
import math
import os
import pickle
from collections import OrderedDict

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from fedlm.config_load import ConfigError
from fedlm.engine import EngineError
from fedlm.engine.dry_run import run_clock
from fedlm.sim import fleet, quantities as Q
from tests.conftest import tiny_config
from tests.fuzzing import RANDOM, SEED, time_bound

FUZZ = settings(max_examples=60, deadline=None, database=None,
                derandomize=not os.environ.get("FEDLM_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
BOUND_S = 20.0  # seconds any one example may take, refusal or run

odd_numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                        st.integers(min_value=-10**30, max_value=10**30),
                        st.sampled_from([0, 1e-320, 1e-300, 1e-9, 1e9, 1e308]))
plausible = st.floats(min_value=1e-3, max_value=1e4)
# mostly plausible (so that accepted inputs run), now and then anything
numbers = st.one_of(plausible, plausible, plausible, odd_numbers)
junk = st.one_of(odd_numbers, st.text(max_size=5), st.none(), st.booleans(),
                 st.lists(odd_numbers, max_size=3))
ids = st.one_of(st.integers(min_value=1, max_value=20), st.integers(min_value=1, max_value=20),
                st.integers(min_value=-5, max_value=0), st.text(max_size=4))


@st.composite
def _client_windows(draw):
    """An availability client: sorted windows inside its period."""
    period = draw(st.floats(min_value=10, max_value=1e6))
    ends = sorted(draw(st.lists(st.floats(min_value=0, max_value=period), max_size=6)))
    ends = ends[:len(ends) // 2 * 2]
    return {"active": ends[0::2], "inactive": ends[1::2], "finish_time": period}


def _device_client():
    return st.fixed_dictionaries({"computation": st.floats(min_value=1, max_value=500),
                                  "communication": st.floats(min_value=10, max_value=1e6)})


@st.composite
def _trace(draw, client):
    """A trace of 1-5 clients drawn by ``client``; half the time one thing in it is then
    broken: a client's field, a whole client, or its id."""
    clients = draw(st.lists(client, min_size=1, max_size=5))
    data = {str(k + 1): c for k, c in enumerate(clients)}
    what = draw(st.integers(0, 5))
    key = draw(st.sampled_from(sorted(data)))
    if what == 1:
        data[key] = dict(data[key], **{draw(st.sampled_from(sorted(data[key]))): draw(junk)})
    elif what == 2:
        data[key] = draw(junk)
    elif what == 3:
        data[draw(ids)] = data.pop(key)
    elif what == 4:
        data[key] = dict(data[key], **{draw(st.sampled_from(sorted(data[key]))): draw(numbers)})
    return data


device_clients = _trace(_device_client())
availability_clients = _trace(_client_windows())


def _write(tmp_path, data, how: str):
    path = tmp_path / f"trace-{how}"
    if how == "json":
        try:
            path.write_text(json.dumps(data, allow_nan=True))
        except (TypeError, ValueError):
            path.write_text("{")
    elif how.startswith("pickle"):
        path.write_bytes(pickle.dumps(data, protocol=int(how[-1])))
    else:
        path.write_bytes(data if isinstance(data, bytes) else b"\x80\x04junk")
    return path


def _one_line(exc: ConfigError) -> None:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, text


def _accepted_fleet_is_sane(cfg) -> None:
    """No silent nonsense: every worker's quantities within their stated ranges."""
    for p in fleet.profiles(cfg.fleet, cfg.workers, cfg.inner.batch_size):
        assert Q.STEP.ok(p.step_time), p
        assert Q.BANDWIDTH.ok(p.region.down_bw) and Q.BANDWIDTH.ok(p.region.up_bw), p
        assert Q.LATENCY.ok(p.region.latency), p


def _runs_or_stops(cfg) -> None:
    """The engine's clock on ``cfg``: finishes, or stops with one line, within bounds."""
    zeros = OrderedDict(w=torch.zeros(4))
    try:
        engine, spans = run_clock(cfg, zeros)
    except EngineError as exc:
        assert "\n" not in str(exc) and str(exc), exc  # one line: no progress, all retired
        return
    assert math.isfinite(engine.now) and engine.now >= 0
    assert all(math.isfinite(v) and v >= 0 for v in spans.values()), spans


def _timed(fn) -> None:
    with time_bound(BOUND_S):  # fires while the example runs, not after it returns
        fn()


def _check_trace(tmp_path, data, how, key) -> None:
    path = _write(tmp_path, data, how)
    sets = [f"fleet.{key}={path}", "updates=3", "inner.steps=2"]

    def check():
        try:
            cfg = tiny_config(*sets)
        except ConfigError as exc:
            _one_line(exc)
            return
        _accepted_fleet_is_sane(cfg)
        _runs_or_stops(cfg)

    _timed(check)


formats = st.sampled_from(["json", "json", "pickle2", "pickle4", "pickle5", "bytes"])


@FUZZ
@given(st.one_of(device_clients, device_clients, availability_clients, st.binary(max_size=64)),
       formats)
def test_device_trace_files(tmp_path, data, how):
    _check_trace(tmp_path, data, how, "device_trace")


@FUZZ
@given(st.one_of(availability_clients, availability_clients, device_clients,
                 st.binary(max_size=64)), formats)
def test_availability_trace_files(tmp_path, data, how):
    _check_trace(tmp_path, data, how, "availability_trace")


@seed(SEED)
@RANDOM
@given(st.one_of(device_clients, availability_clients, st.binary(max_size=64)), formats,
       st.sampled_from(["device_trace", "availability_trace"]))
def test_random_round_of_trace_files(tmp_path, data, how, key):
    _check_trace(tmp_path, data, how, key)


fleet_numbers = st.one_of(st.floats(min_value=0.5, max_value=500), st.floats(min_value=1, max_value=50),
                          st.floats(allow_nan=True, allow_infinity=True, width=64),
                          st.sampled_from([0.0, 1e-300, 0.01, 1.0, 5.0, 60.0, 1e6, 1e12]))


@FUZZ
@given(st.fixed_dictionaries({
    "fleet.join": st.lists(fleet_numbers, max_size=3),
    "fleet.leave": st.lists(fleet_numbers, max_size=3),
    "fleet.availability": st.dictionaries(st.sampled_from(["up", "down"]), fleet_numbers,
                                          max_size=2),
    "fleet.slowdown": st.dictionaries(st.sampled_from(["factor", "normal", "slow"]),
                                      fleet_numbers, max_size=3),
    "fleet.stragglers": st.dictionaries(st.sampled_from(["p", "factor", "alpha", "max"]),
                                        fleet_numbers, max_size=4),
    "fleet.step_times": st.lists(fleet_numbers, max_size=3),
    "network.server_up": st.sampled_from([0.0, 1e-300, 1e6, 1e20]),
}), st.sampled_from(["diloco", "diloco-fill", "delayed-nesterov"]))
def test_fleet_dynamics_and_links(values, strategy):
    sets = [f"strategy={strategy}", "updates=3", "inner.steps=2"]
    for key, value in values.items():
        if value in ([], {}):
            continue
        if isinstance(value, dict):
            body = ", ".join(f"{k} = {_toml(v)}" for k, v in value.items())
            sets.append(f"{key}={{{body}}}")
        elif isinstance(value, list):
            sets.append(f"{key}=[{', '.join(_toml(v) for v in value)}]")
        else:
            sets.append(f"{key}={_toml(value)}")

    def check():
        try:
            cfg = tiny_config(*sets)
        except ConfigError as exc:
            _one_line(exc)
            return
        _accepted_fleet_is_sane(cfg)
        for t in (*cfg.fleet.join, *cfg.fleet.leave):
            assert Q.TIME.ok(t)
        _runs_or_stops(cfg)

    _timed(check)


def _toml(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


plugin_bodies = st.sampled_from([
    "raise SystemExit(0)", "raise SystemExit('bye')", "raise KeyboardInterrupt",
    "raise RuntimeError('boom')", "raise ImportError('no')", "S = 3", "S = None",
    "class S:\n    pass",
    "from fedlm.strategies.diloco import DiLoCo\nclass S(DiLoCo):\n    server = 'nowhere:X'",
    "from fedlm.strategies.diloco import DiLoCo\nclass S(DiLoCo):\n    server = ':'",
    "from fedlm.strategies.diloco import DiLoCo\nclass S(DiLoCo):\n    server = 'os:path'",
    "from fedlm.strategies.diloco import DiLoCo\nclass S(DiLoCo):\n    def __init__(self):\n"
    "        raise ValueError('no')",
    "import sys\nsys.exit(3)",
])


@FUZZ
@given(plugin_bodies, st.sampled_from(["S", "T", "", "S:S", "__class__"]))
def test_plugin_modules(tmp_path, monkeypatch, body, attr):
    # a module of its own per example: an import is cached by name
    name = f"fuzzplug_{abs(hash((body, attr))) % 10**9}"
    (tmp_path / f"{name}.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    if body.startswith("raise KeyboardInterrupt"):
        return  # Ctrl-C stops fedlm as it should: not a plug-in's answer to give
    try:
        cfg = tiny_config(f"strategy={name}:{attr}", "updates=1")
    except ConfigError as exc:
        _one_line(exc)
        return
    pytest.fail(f"accepted a broken plug-in: {cfg.strategy}")


@FUZZ
@given(st.text(max_size=40))
def test_plugin_paths(path):
    try:
        tiny_config(f"strategy={json.dumps(path)}")
    except ConfigError as exc:
        _one_line(exc)


def test_the_time_bound_fires_inside_an_example_that_never_returns():
    """The bound the examples run under stops a loop that spins (as the trace reader
    once did), instead of waiting for it to return."""
    from tests.fuzzing import ExampleTimedOut

    with pytest.raises(ExampleTimedOut, match="ran past its bound of 0.2 s"):
        with time_bound(0.2):
            while True:
                pass
