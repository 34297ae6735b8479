"""Values that load but mean nothing are refused in one line, or said: a grace window
longer than a day, a measured network nobody is placed on or whose links are absurd, a
planner asked about a model past any scale it was made for, a sweep of more seeds than
--seeds allows, a grace window given to a synchronous strategy."""

import pytest

from fedlm import config_check
from fedlm.cli.plan import parse_count
from fedlm.errors import ConfigError
from fedlm.sweep import spec as sweep_spec
from tests.conftest import tiny_config

MATRIX = 'fleet.matrix={regions=["a","b"],gbit=[[100,%s],[%s,100]],latency=[[0,%s],[%s,0]]}'


@pytest.mark.parametrize("sets,message", [
    (["strategy=delayed-nesterov", "grace=1e308"], "grace: must be auto, adaptive, off or a "
                                                   "number of seconds in [0, 86400]"),
    (["strategy=delayed-nesterov", "grace=86401"], "grace: must be"),
    ([MATRIX % (1, 1, 0.1, 0.1)], "fleet.matrix: no worker is in any of its regions (a, b)"),
    ([MATRIX % ("1e-300", "1e-300", 0.1, 0.1), "fleet.topology={a=2,b=1}"],
     "fleet.matrix: gbit: every bandwidth must be between 1e-06 and 1e+06 Gbit/s"),
    ([MATRIX % ("1e9", "1e9", 0.1, 0.1), "fleet.topology={a=2,b=1}"], "fleet.matrix: gbit:"),
    ([MATRIX % (1, 1, "1e308", "1e308"), "fleet.topology={a=2,b=1}"],
     "fleet.matrix: latency: every latency must be between 0 and 3600 s"),
])
def test_nonsense_is_refused(sets, message):
    with pytest.raises(ConfigError) as info:
        tiny_config(*sets)
    assert str(info.value).startswith(message), str(info.value)


def test_sane_values_at_the_edges_still_load():
    tiny_config("strategy=delayed-nesterov", "grace=86400")
    tiny_config(MATRIX % ("1e-6", "1e6", 0, 3600), "fleet.topology={a=2,b=1}")
    tiny_config(MATRIX % (1, 1, 0.1, 0.1), "fleet.topology={a=3}")  # the server's region only


def test_a_grace_window_on_a_synchronous_strategy_is_said_not_ignored():
    assert config_check.notes(tiny_config("strategy=diloco", "grace=5")) == [
        "grace = 5 does nothing for the synchronous strategy 'diloco': its barrier "
        "already waits for every job of a round"]
    assert config_check.notes(tiny_config("strategy=diloco")) == []
    assert config_check.notes(tiny_config("strategy=delayed-nesterov", "grace=5")) == []


@pytest.mark.parametrize("text", ["1e30", "2e15", "1001T"])
def test_the_planner_refuses_a_model_past_its_scale(text):
    with pytest.raises(ConfigError, match=r"--params: at most 1e\+15"):
        parse_count(text)
    assert parse_count("100T") == 1e14 and parse_count("1e15") == 1e15


@pytest.mark.parametrize("where", ["spec", "arm"])
def test_a_sweep_spec_with_more_seeds_than_seeds_allows_is_refused(tmp_path, where):
    seeds = "seeds = [%s]" % ", ".join(map(str, range(1025)))
    path = tmp_path / "s.toml"
    path.write_text(f'db = "{tmp_path / "s.db"}"\nout = "{tmp_path / "s.md"}"\n'
                    f'profiles = ["very"]\nbase = ["model=tiny"]\n'
                    + (seeds + "\n" if where == "spec" else "seeds = [0]\n")
                    + '[[arm]]\nlabel = "sync"\nreference = true\nset = ["strategy=diloco"]\n'
                    + (seeds + "\n" if where == "arm" else ""))
    with pytest.raises(ConfigError, match="at most 1024 seeds, got 1025"):
        sweep_spec.load_spec(path, quick=False)


@pytest.mark.parametrize("command", [["run"], ["deploy", "local"]])
def test_a_tracker_not_installed_is_refused_before_the_store_is_made(tmp_path, monkeypatch,
                                                                      capsys, command):
    from fedlm import cli
    from fedlm.deploy import run_local as local
    from fedlm.track import backends

    real = backends.importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("mlflow") else real(name, *a))
    monkeypatch.setattr(local, "main_local", lambda *a, **k: pytest.fail("deployed"))
    db, home = tmp_path / "r.db", tmp_path / "home"
    extra = ["--home", str(home)] if command[0] == "deploy" else []
    assert cli.main([*command, *extra, "--db", str(db), "--track", "mlflow",
                     "--set", "model=tiny"]) == 2
    assert "not installed" in capsys.readouterr().err
    assert not db.exists() and not list(tmp_path.iterdir())  # no store, no deployment home


def test_a_run_whose_evaluated_model_never_changed_says_so(tmp_path, capsys):
    import sqlite3

    from fedlm.cli.runs import print_summary
    from fedlm.runner import run_inprocess

    db = tmp_path / "r.db"
    run_inprocess(tiny_config("updates=1"), str(db))
    assert print_summary(str(db), 1) == 0
    assert "never changed" not in capsys.readouterr().out
    with sqlite3.connect(db) as conn:  # as a run whose updates reached no evaluated model
        conn.execute("UPDATE runs SET final_hash = COALESCE(start_hash, initial_hash)")
    assert print_summary(str(db), 1) == 0
    assert "note: the evaluated model never changed" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--workers", "100000000"], "--workers: must be <= 10,000,000 in all"),
    (["--workers", "2000000", "--data-centres", "2000000"], "--data-centres: must be <= 1,000,000"),
])
def test_the_planner_refuses_a_huge_fleet_at_once(argv, message, capsys):
    import time

    from fedlm import cli

    t0 = time.perf_counter()
    assert cli.main(["plan", *argv]) == 2
    assert message in capsys.readouterr().err
    assert time.perf_counter() - t0 < 2.0  # not after building a hundred million workers


def test_the_planner_derives_the_step_time_from_the_model_and_says_so(capsys):
    from fedlm import cli

    assert cli.main(["plan", "--params", "100T", "--data-centres", "20"]) == 0
    first, *rest = capsys.readouterr().out.splitlines()
    # 6 x 1e14 parameters x 4M tokens over 1e18 FLOP/s at 40%
    assert first.startswith("fedlm plan: step time 6000 s per inner step, derived: 6 x 1e+14")
    assert "H = 100 steps of 100 min" in rest[0]
    utilisation = next(line for line in rest if line.startswith("compute utilisation"))
    assert "0.0%" not in utilisation  # a fixed 0.5 s step gave 0.0%
    assert cli.main(["plan", "--params", "1e9", "--step-time", "0.5"]) == 0
    assert "derived" not in capsys.readouterr().out  # given: nothing to say
