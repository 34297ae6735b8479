"""One check of physical quantities wherever they come from (fedlm/sim/quantities.py):
the config, traces, fleet dynamics and plug-in paths refuse nonsense in one line that
names where it came from, with the same words for the same kind of quantity."""

import json

import pytest

from fedlm.config_load import ConfigError
from tests.conftest import tiny_config

STEP = "must be seconds per inner step in [1e-09, 1e+06]"
BANDWIDTH = "must be a bandwidth in bytes/s in [125, 1.25e+14]"


def _device(tmp_path, computation, communication=1000.0) -> str:
    path = tmp_path / "device.json"
    path.write_text(json.dumps({"1": {"computation": computation, "communication": communication},
                                "2": {"computation": 10.0, "communication": 1000.0}}))
    return f"fleet.device_trace={path}"


def _availability(tmp_path, finish=1000.0) -> str:
    path = tmp_path / "avail.json"
    path.write_text(json.dumps({"1": {"active": [0.0], "inactive": [finish / 2],
                                      "finish_time": finish}}))
    return f"fleet.availability_trace={path}"


CASES = [  # (overrides, the message's start)
    (["fleet.step_times=[1.0, -2.0]"], f"fleet.step_times[1]: {STEP}, got -2.0"),
    (["fleet.base_step_time=1e307"], f"fleet.base_step_time: {STEP}"),
    (["fleet.join=[1e308, 0, 0]"], "fleet.join[0]: must be a time in seconds in [0, 1e+09]"),
    (["fleet.leave=[0, -1]"], "fleet.leave[1]: must be a time in seconds"),
    (["fleet.stragglers={p = 1, alpha = 1e-300, max = 1e308}"],
     "fleet.stragglers.alpha: must be a Pareto shape in [0.01, 100]"),
    (["fleet.stragglers={max = 1e308}"], "fleet.stragglers.max: must be a factor in [1, 1e+06]"),
    (["fleet.slowdown={factor = 0.5}"], "fleet.slowdown.factor: must be a factor in (1, 1e+06]"),
    (["fleet.availability={up = 1e-320, down = 1}"],
     "fleet.availability.up: must be a duration in seconds in [1e-06, 1e+09]"),
    (["fleet.trace_time_scale=1e-9"], "fleet.trace_time_scale: must be a time scale"),
    (["network.server_up=1e-300"], f"network.server_up: {BANDWIDTH}"),
    (["network.intra_bw=1e300"], f"network.intra_bw: {BANDWIDTH}"),
    (["fleet.links={far = {latency = 1e9, down_bw = 1e6, up_bw = 1e6}}"],
     "fleet.links.far.latency: must be a latency in seconds in [0, 3600]"),
    (["fleet.jitter=1e9"], "fleet.jitter: must be a lognormal sigma in [0, 10]"),
]


@pytest.mark.parametrize("sets,start", CASES, ids=[c[1].split(":")[0] for c in CASES])
def test_config_quantities_are_refused_in_one_line(sets, start):
    with pytest.raises(ConfigError) as err:
        tiny_config(*sets)
    assert str(err.value).startswith(start) and "\n" not in str(err.value)


@pytest.mark.parametrize("computation,communication,start", [
    (0.0, 1000.0, f"'computation' 0 ms/sample at batch 4 gives 0.0, which {STEP}"),
    (1e307, 1000.0, f"'computation' 1e+307 ms/sample at batch 4 gives 1.2e+305, which {STEP}"),
    (10.0, 1e-300, f"'communication' 1e-300 kbit/s gives 1.28e-298, which {BANDWIDTH}"),
])
def test_a_device_traces_numbers_are_checked_as_the_configs(tmp_path, computation,
                                                              communication, start):
    with pytest.raises(ConfigError) as err:  # with DyLU, 0 s per step divided by zero
        tiny_config(_device(tmp_path, computation, communication), "strategy=delayed-nesterov",
                    "local_steps=dylu")
    assert str(err.value).startswith(f"fleet.device_trace: client 1: {start}")


def test_an_availability_traces_period_in_run_seconds_is_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"^fleet.availability_trace: client 1: 'finish_time' "
                                          r"1e\+300 x fleet.trace_time_scale 1e\+06 gives"):
        tiny_config(_availability(tmp_path, 1e300), "fleet.trace_time_scale=1e6")


def test_a_client_id_twice_in_a_json_trace_is_refused(tmp_path):
    path = tmp_path / "twice.json"
    path.write_text('{"1": {"computation": 10, "communication": 100}, '
                    '"1": {"computation": 20, "communication": 100}}')
    with pytest.raises(ConfigError, match=r"'1' appears twice in one JSON object"):
        tiny_config(f"fleet.device_trace={path}")


@pytest.mark.parametrize("key,value", [("step_times", "[1.0, 2.0, 3.0]"),
                                       ("topology", "{us = 3}"),
                                       ("regions", '["us", "eu", "us"]')])
def test_what_a_device_trace_sets_is_not_also_taken_from_the_config(tmp_path, key, value):
    with pytest.raises(ConfigError, match=rf"^fleet.{key}: is set by fleet.device_trace"):
        tiny_config(_device(tmp_path, 10.0), f"fleet.{key}={value}")


def test_a_time_scale_without_a_trace_is_refused_not_ignored(tmp_path):
    with pytest.raises(ConfigError, match=r"^fleet.trace_time_scale: scales an availability "
                                          r"trace's times, and no fleet.availability_trace"):
        tiny_config("fleet.trace_time_scale=0.5")
    assert tiny_config(_availability(tmp_path), "fleet.trace_time_scale=0.5")


def test_streaming_with_a_changing_fleet_is_refused_as_the_docs_say():
    with pytest.raises(ConfigError, match=r"not Streaming DiLoCo's fragments"):
        tiny_config("stream.fragments=2", "inner.steps=4", "fleet.join=[0, 5, 0]")


@pytest.mark.parametrize("module,start", [
    ("raise SystemExit(0)\n", "strategy: importing 'plug_{n}' raised SystemExit: 0"),
    ("raise RuntimeError('boom')\n", "strategy: importing 'plug_{n}' raised RuntimeError: boom"),
])
def test_a_plugin_that_exits_or_raises_on_import_is_one_line(tmp_path, monkeypatch, module,
                                                             start):
    n = len(start)  # a module name of its own per case
    (tmp_path / f"plug_{n}.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        tiny_config(f"strategy=plug_{n}:S")
    assert str(err.value) == start.format(n=n)


def test_a_plugins_server_that_is_no_server_or_raises_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "plug_srv.py").write_text(
        "from fedlm.strategies.diloco import DiLoCo\n"
        "class NotServer:\n    pass\n"
        "class A(DiLoCo):\n    name = 'a'\n    default_server = 'plug_srv:NotServer'\n"
        "class B(DiLoCo):\n    name = 'b'\n    default_server = 'plug_raise:X'\n")
    (tmp_path / "plug_raise.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^server \(the default of strategy 'plug_srv:A'\): "
                                          r"'plug_srv:NotServer' is not a kind of server \(a "
                                          r"subclass of fedlm.servers.Server or ServerKind\)$"):
        tiny_config("strategy=plug_srv:A")
    with pytest.raises(ConfigError, match=r"^server \(the default of strategy 'plug_srv:B'\): "
                                          r"importing 'plug_raise' raised RuntimeError: boom$"):
        tiny_config("strategy=plug_srv:B")
    with pytest.raises(ConfigError, match=r"^server: importing 'plug_raise' raised "
                                          r"RuntimeError: boom$"):
        tiny_config("server=plug_raise:X")
