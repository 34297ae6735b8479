import subprocess
import sys

import pytest

from fedlm import config_load
from fedlm.errors import ConfigError


def test_defaults_are_valid_and_documented():
    cfg = config_load.load()
    assert (cfg.workers, cfg.fleet.preset, cfg.model, cfg.strategy) == (4, "moderate", "small",
                                                                         "diloco")
    assert config_load.from_json(cfg.to_json()) == cfg


def test_set_overrides_parse_toml_values_and_aliases():
    cfg = config_load.load(None, ["inner.lr=1e-3", "strategy=fedavg", "profile=very",
                                  "fleet.step_times=[1, 2.5]", "outer.lr=0.5"])
    assert cfg.inner.lr == 1e-3 and isinstance(cfg.inner.lr, float)
    assert cfg.strategy == "fedavg" and cfg.fleet.preset == "very"
    assert cfg.fleet.step_times == [1.0, 2.5]
    assert cfg.outer == {"lr": 0.5}


@pytest.mark.parametrize("override, fragment", [
    ("bogus=1", "bogus: unknown key"),
    ("inner.bogus=1", "inner.bogus: unknown key"),
    ("fleet.step_times=[1.0, -2.0]",
     "fleet.step_times[1]: must be seconds per inner step in [1e-09, 1e+06], got -2.0"),
    ("fleet.preset=warp", "fleet.preset: unknown preset"),
    ("strategy=nope", "strategy: unknown strategy 'nope'"),
    ("model=huge", "model: unknown preset"),
    ("workers=0", "workers: must be >= 1, got 0"),
    ("inner.lr=fast", "inner.lr: expected float, got 'fast'"),
    ("outer.momentum=2.0", "outer.momentum: must be in [0, 1), got 2.0"),
    ("outer.warp=1", "outer.warp: not a setting of 'diloco'"),
    ("data.partition=random", "data.partition: must be iid, by-play or dirichlet"),
    ("local_steps=magic", "local_steps: unknown policy 'magic'"),
])
def test_bad_values_are_refused_with_one_line_naming_the_field(override, fragment):
    with pytest.raises(ConfigError) as info:
        config_load.load(None, [override])
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_config_file_round_trip(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('strategy = "fedavg"\nworkers = 2\n[inner]\nsteps = 7\n')
    cfg = config_load.load(path)
    assert (cfg.strategy, cfg.workers, cfg.inner.steps) == ("fedavg", 2, 7)
    with pytest.raises(ConfigError, match="no such file"):
        config_load.load(tmp_path / "missing.toml")


def test_cli_refuses_bad_config_without_traceback():
    out = subprocess.run([sys.executable, "-m", "fedlm", "run", "--set", "fleet.step_times=[-1]"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == ("fedlm: error: fleet.step_times[0]: must be seconds per inner "
                                  "step in [1e-09, 1e+06], got -1.0")
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("old, new, value", [("concurrency", "max_in_flight", 2),
                                             ("sim.actors", "sim.ray_actors", 3),
                                             ("sim.concurrent_jobs", "sim.job_threads", 2)])
def test_renamed_keys_still_read_as_the_new_ones(old, new, value):
    def nested(key, v):
        section, _, name = key.rpartition(".")
        return {section: {name: v}} if section else {name: v}

    def get(cfg, key):
        section, _, name = key.rpartition(".")
        return getattr(getattr(cfg, section) if section else cfg, name)

    by_set = config_load.load(None, [f"{old}={value}"])
    by_dict = config_load.from_dict(nested(old, value))  # a TOML file, a stored run's JSON
    assert get(by_set, new) == get(by_dict, new) == value
    assert f'"{old.rpartition(".")[2]}"' not in by_set.to_json()  # written under the new name
    both = nested(old, value)
    section, _, name = new.rpartition(".")
    (both[section] if section else both)[name] = value
    with pytest.raises(ConfigError, match="give only one"):
        config_load.from_dict(both)


def test_a_plugin_setting_named_as_a_moved_key_is_refused(tmp_path, monkeypatch):
    # outer.mix is read as stream.mix: a plug-in's own `mix` could never be set, and a
    # value given for it would change the streaming mix without a word
    (tmp_path / "mix_plugin.py").write_text(
        "from fedlm.strategies.async_base import AsyncStrategy\n"
        "class Mixer(AsyncStrategy):\n"
        "    name = 'mixer'\n"
        "    def __init__(self, *, mix: float = 0.5):\n"
        "        super().__init__(lr=mix)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"setting 'mix' cannot be given: fedlm reads "
                                          r"outer.mix as stream.mix"):
        config_load.load(None, ["strategy=mix_plugin:Mixer"])
    assert config_load.load(None, ["outer.mix=0.25"]).stream.mix == 0.25  # the old name reads


@pytest.mark.parametrize("strategy", ["fedavg", "diloco", "diloco-fill", "diloco-dylu"])
def test_a_setting_handed_on_to_the_parent_is_type_checked_by_name(strategy):
    # DiLoCo takes FedAvg's sampling settings through **sampling: their types are FedAvg's
    with pytest.raises(ConfigError, match=r"^outer\.overcommit: expected float, got \[\]"):
        config_load.load(None, [f"strategy={strategy}", "outer.overcommit=[]"])
