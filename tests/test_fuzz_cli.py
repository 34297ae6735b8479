"""Fuzzing the command line and sweep specs: every bad argument or spec is refused in
one line (exit 2) before any work starts. The config loader's own fuzzing, and the
generators used here, are tests/test_fuzz_config.py's."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
import tomli_w
from hypothesis import given
from hypothesis import strategies as st

from fedlm import cli, config_load
from fedlm.errors import ConfigError
from tests._cli import assert_refused, no_work_fixture, run_cli  # noqa: F401 (a fixture)
from tests.test_fuzz_config import FUZZ, FUZZ_SMALL, mutations, toml_inline, toml_values


# ---------------------------------------------------------------------------
# The CLI, in-process
# ---------------------------------------------------------------------------

@FUZZ
@given(mutations())
def test_cli_config_matches_the_loader(no_work, flat):
    overrides = [f"{k}={toml_inline(v)}" for k, v in flat.items()]
    argv = ["config"] + [a for o in overrides for a in ("--set", o)]
    rc, out, err = run_cli(argv)
    try:
        cfg = config_load.load(None, overrides)
    except ConfigError as exc:
        assert_refused(rc, out, err)
        assert err == f"fedlm: error: {exc}\n"
        return
    assert rc == 0 and err == "", (rc, err)
    assert config_load.from_dict(tomllib.loads(out)) == cfg  # `fedlm config` output loads back


@FUZZ_SMALL
@given(st.sampled_from(["run", "deploy"]), mutations(), st.booleans())
def test_cli_run_and_deploy_refuse_before_any_work(no_work, command, flat, with_file):
    overrides = [f"{k}={toml_inline(v)}" for k, v in flat.items()]
    argv = [command] + (["local"] if command == "deploy" else [])
    if with_file:
        (no_work / "c.toml").write_text(tomli_w.dumps({"workers": 2}))
        argv.append("c.toml")
    argv += [a for o in overrides for a in ("--set", o)]
    rc, out, err = run_cli(argv)
    try:
        config_load.load("c.toml" if with_file else None, overrides)
    except ConfigError as exc:
        assert_refused(rc, out, err)
        assert err == f"fedlm: error: {exc}\n"
        return
    assert rc == "started", (rc, out, err)


TOKENS = ["--set", "--db", "--format", "--out", "--quick", "--backend", "--workers", "--port",
          "--resume", "--jobs",
          "--host", "--home", "--rerun", "--quiet", "local", "csv", "parquet", "flower",
          "inprocess", "1", "0", "-1", "99999", "x", "x=1", "workers=0", "inner.lr=inf", "",
          "=", "-", "--", "--bogus", "ü", "a\nb", "99999999999999999999999"]
COMMANDS = sorted(cli.COMMANDS)


@FUZZ
@given(st.sampled_from(COMMANDS + ["", "bogus", "-x"]),
       st.lists(st.sampled_from(TOKENS) | st.text(st.characters(exclude_characters="\x00"),
                                                  max_size=6), max_size=6))
def test_cli_random_argv(no_work, command, rest):
    rc, out, err = run_cli([command, *rest])
    assert "Traceback" not in err
    if rc == 0 or rc == "started":
        return
    assert_refused(rc, out, err)


@pytest.mark.parametrize("argv, fragment", [
    ([], "required: command"),
    (["bogus"], "invalid choice: 'bogus'"),
    (["show"], "required: run_id"),
    (["show", "one"], "invalid int value: 'one'"),
    (["export", "1", "--format", "xml"], "invalid choice: 'xml'"),
    (["run", "--backend", "ray"], "invalid choice: 'ray'"),
    (["deploy", "remote"], "invalid choice: 'remote'"),
    (["deploy", "local", "--workers", "0"], "workers: must be >= 1, got 0"),
    (["deploy", "local", "--workers", "many"], "invalid int value: 'many'"),
    (["dashboard", "--port", "99999"], "--port: must be in [1, 65535], got 99999"),
    (["run", "--set", "inner.lr"], "--set inner.lr: expected key=value"),
    (["run", "--set", "=1"], "--set =1: empty key"),
    (["run", "missing.toml"], "config: no such file 'missing.toml'"),
    (["config", "--set", "fleet.step_times=[1, inf]"], "fleet.step_times[1]: must be a finite"),
    (["run", "--set", "strategy=:x"], "strategy: cannot load ':x'"),
    (["run", "--db", "."], "db: "),
    (["sweep", "missing.toml"], "sweep spec: no such file 'missing.toml'"),
    (["run", "--set", "sim.batched=on"], "sim.batched: 'on' trains jobs together in one"),
    (["run", "--backend", "inprocess", "--set", "sim.ray_address=auto"],
     "sim.ray_address: attaches Flower's Ray actors to a cluster"),
    (["run", "--set", "strategy=diloco-fill", "--set", "fleet.step_times=[0.001, 100]"],
     "worker 0's first job would run 3,000,000 inner steps"),
])
def test_cli_bad_arguments_give_one_line(no_work, argv, fragment):
    assert_refused(*run_cli(argv), fragment)


# ---------------------------------------------------------------------------
# sweep specs
# ---------------------------------------------------------------------------

GOOD_SPEC = {"db": "runs/s.db", "out": "runs/s.md", "profiles": ["homogeneous"],
             "base": ["model=tiny"],
             "arm": [{"label": "a", "set": ["strategy=fedavg"], "reference": True},
                     {"label": "b", "set": ["strategy=diloco"]}]}


def test_good_sweep_spec_is_accepted(no_work):
    (no_work / "s.toml").write_text(tomli_w.dumps(GOOD_SPEC))
    assert run_cli(["sweep", "s.toml", "--quick"])[0] == "started"


@pytest.mark.parametrize("change, fragment", [
    ({"arm": "nope"}, "arm"),
    ({"arm": []}, "reference"),
    ({"arm": [{"label": "a", "set": ["strategy=fedavg"]}]}, "reference"),
    ({"arm": [{"set": ["x=1"], "reference": True}]}, "label"),
    ({"arm": [{"label": "a", "set": "strategy=fedavg", "reference": True}]}, "set"),
    ({"arm": [{"label": "a", "set": ["strategy=nope"], "reference": True}]},
     "strategy: unknown strategy 'nope'"),
    ({"profiles": ["warp"]}, "fleet.preset: unknown preset"),
    ({"profiles": "homogeneous"}, "profiles"),
    ({"base": ["inner.lr=inf"]}, "inner.lr: must be a finite number"),
    ({"db": 5}, "db"),
    ({"quick": {"profiles": 3}}, "profiles"),
    ({"quick": 3}, "quick"),
])
def test_bad_sweep_specs_are_refused_before_any_run(no_work, change, fragment):
    (no_work / "s.toml").write_text(tomli_w.dumps({**GOOD_SPEC, **change}))
    rc, out, err = run_cli(["sweep", "s.toml", "--quick"])
    assert_refused(rc, out, err, fragment)


@FUZZ_SMALL
@given(st.dictionaries(st.sampled_from(sorted(GOOD_SPEC) + ["quick", "title", "x"]),
                       toml_values, max_size=4))
def test_fuzzed_sweep_specs(no_work, change):
    try:
        text = tomli_w.dumps({**GOOD_SPEC, **change})
    except (TypeError, ValueError):
        return
    (no_work / "s.toml").write_text(text)
    rc, out, err = run_cli(["sweep", "s.toml", "--quick"])
    if rc != "started":
        assert_refused(rc, out, err)


def test_sweep_spec_not_toml(no_work):
    (no_work / "s.toml").write_bytes(b"\xff\xfe[[[")
    assert_refused(*run_cli(["sweep", "s.toml"]), "sweep spec")
    (no_work / "t.toml").write_text("arm = [")
    assert_refused(*run_cli(["sweep", "t.toml"]), "sweep spec")


# ---------------------------------------------------------------------------
# A few through a real subprocess (what a user sees)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv, line", [
    (["run", "--set", "inner.lr=nan", "--db", "{tmp}/r.db"],
     "fedlm: error: inner.lr: must be a finite number, got nan"),
    (["show", "zero"],
     "fedlm show: error: argument run_id: invalid int value: 'zero' (see fedlm show --help)"),
])
def test_subprocess_one_line_exit_2(tmp_path, argv, line):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out = subprocess.run([sys.executable, "-m", "fedlm", *argv], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out
    assert out.stderr == line + "\n"
    assert not (tmp_path / "r.db").exists()  # refused before the run database was touched
