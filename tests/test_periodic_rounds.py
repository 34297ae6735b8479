"""examples/periodic_rounds.py: synchronous rounds that the server closes every
``server.period`` virtual seconds (a timer of the run's clock), driven as a user would,
with ``PYTHONPATH=examples``."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fedlm import store
from fedlm.config_load import load
from fedlm.errors import ConfigError
from fedlm.runner import run_inprocess
from tests.support import trains_replays_and_resumes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
KIND = "server.kind=periodic_rounds:PeriodicRounds"
# tiny and short: jobs of 10 steps take 10, 17 and 30 s on the moderate fleet's workers
BASE = ("model=tiny", "workers=3", "updates=6", "inner.steps=10")


@pytest.fixture(autouse=True)
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(EXAMPLES), os.environ.get("PYTHONPATH", "")) if p))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedlm", *args], capture_output=True,
                          text=True, timeout=300)


def run(tmp_path, name: str, *sets: str) -> tuple[Path, str]:
    db = tmp_path / f"{name}.db"
    run_inprocess(load(None, [*BASE, *sets]), str(db))
    (stored,) = store.list_runs(db)
    assert stored["status"] == "finished"
    return db, stored["final_hash"]


def rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_a_short_period_trains_cuts_rounds_replays_and_resumes(tmp_path):
    # perplexity falls, replay (fedlm.replay.replay) and a resume end on the same weights
    ref = trains_replays_and_resumes(tmp_path, *BASE, KIND, "server.period=8", stop_at=3)
    rang = rows(ref, "SELECT virtual_time FROM events WHERE kind = 'timer' ORDER BY id")
    assert [t for (t,) in rang[:3]] == [8.0, 16.0, 24.0]  # every period, from the start
    late = rows(ref, "SELECT applied_version FROM updates WHERE staleness > 0")
    assert late and all(v is None for (v,) in late)  # cut jobs' work came late: dropped
    # the command line's replay of the same run
    done = cli("replay", "1", "--db", str(ref))
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("identical")


def test_late_work_joins_the_next_round_with_late_next(tmp_path):
    db, _ = run(tmp_path, "next", "strategy=diloco", KIND, "server.period=8",
                "outer.late=next")
    late = rows(db, "SELECT applied_version FROM updates WHERE staleness > 0")
    assert late and all(v is not None for (v,) in late)  # merged, none dropped


def test_a_period_longer_than_the_run_is_plain_diloco_bit_for_bit(tmp_path):
    plain, plain_hash = run(tmp_path, "plain", "strategy=diloco")
    db, periodic_hash = run(tmp_path, "periodic", "strategy=diloco", KIND, "server.period=1e9")
    assert periodic_hash == plain_hash
    assert rows(db, "SELECT COUNT(*) FROM events WHERE kind = 'timer'") == [(0,)]
    assert rows(db, "SELECT COUNT(*) FROM updates WHERE staleness > 0") == [(0,)]


@pytest.mark.parametrize("period", ["0", "-5", "nan", "inf", "soon"])
def test_a_bad_period_is_refused_in_one_line(period):
    with pytest.raises(ConfigError) as refused:
        load(None, [*BASE, KIND, f"server.period={period}"])
    message = str(refused.value)
    assert message.startswith("server.period: ") and "\n" not in message


def test_the_command_line_refuses_a_bad_period_and_an_async_strategy_in_one_line():
    done = cli("config", "--set", KIND, "--set", "server.period=-1")
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "fedlm: error: server.period: must be seconds in (0, inf), got -1.0"]
    done = cli("config", "--set", KIND, "--set", "strategy=async-sgd")
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1
    assert "closes synchronous rounds" in done.stderr
