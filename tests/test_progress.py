"""A run that can make no progress stops with one line that says why, after a number of
jobs the docs state (fedlm/engine/stall.py), instead of looping for ever."""

import sqlite3
import sys
from pathlib import Path

import pytest

from fedlm.engine import EngineError
from fedlm.engine.stall import StallWatch, held_limit, lost_limit
from fedlm.runner import run_inprocess
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = str(ROOT / "examples")


def _stalled(tmp_path, *sets) -> tuple[str, sqlite3.Connection]:
    db = tmp_path / "r.db"
    with pytest.raises(EngineError) as err:
        run_inprocess(tiny_config("inner.steps=2", "updates=3", *sets), str(db))
    return str(err.value), sqlite3.connect(db)


def test_presence_windows_shorter_than_any_job_stop_the_run(tmp_path):
    # windows of mean 0.1 s, jobs of 1-10 s: none finishes. (DyLU may size a job down to
    # one step, so the config's own check, which refuses what cannot fit even then,
    # lets it through: the run finds out)
    why, conn = _stalled(tmp_path, "fleet.availability={up=0.1, down=1}", "fleet.preset=very",
                         "strategy=delayed-nesterov", "local_steps=dylu")
    assert why.startswith(f"no progress at version 0: the last {lost_limit(3)} jobs were all "
                          f"lost (departed {lost_limit(3)}): no job fits in its worker's "
                          f"presence window") and "\n" not in why
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "failed"
    assert conn.execute("SELECT detail FROM events WHERE kind='stalled'").fetchone()[0] == why
    lost = conn.execute("SELECT COUNT(*) FROM jobs WHERE status='lost'").fetchone()[0]
    assert lost == lost_limit(3)  # stopped at the bound, not later


def test_a_strategy_that_never_makes_a_version_stops_the_run(tmp_path, monkeypatch):
    # FedAsync that drops every update as too stale (outer.max_staleness = -1 did it; the
    # config refuses that now)
    (tmp_path / "drops_all.py").write_text(
        "from fedasync_example import FedAsync\n"
        "class DropsAll(FedAsync):\n"
        "    def staleness_weight(self, staleness):\n        return None\n")
    monkeypatch.syspath_prepend(EXAMPLES)
    monkeypatch.syspath_prepend(str(tmp_path))
    why, conn = _stalled(tmp_path, "strategy=drops_all:DropsAll")
    assert why.startswith(f"no progress at version 0: {held_limit(3)} updates in a row made "
                          f"no new version: strategy 'fedasync'")
    assert conn.execute("SELECT COUNT(*) FROM updates").fetchone()[0] == held_limit(3)
    sys.modules.pop("fedasync_example", None)
    sys.modules.pop("drops_all", None)


def test_churn_that_lets_jobs_finish_is_not_a_stall(tmp_path):
    # most jobs depart, some finish: the run goes on to its updates
    db = tmp_path / "r.db"
    run_inprocess(tiny_config("inner.steps=2", "updates=3",
                              "fleet.availability={up=8, down=4}"), str(db))
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "finished"
    assert conn.execute("SELECT COUNT(*) FROM jobs WHERE reason='departed'").fetchone()[0] > 0


def test_the_watch_counts_in_a_row_and_round_trips():
    watch = StallWatch(workers=2)
    for _ in range(lost_limit(2) - 1):
        watch.job_lost("deadline")
    assert watch.why_stalled(0, "x") is None
    copy = StallWatch(workers=2)
    copy.load_state_dict(watch.state_dict())
    copy.job_lost("departed")
    assert "deadline 49, departed 1" in copy.why_stalled(0, "x")
    assert "every job is lost" in copy.why_stalled(0, "x")  # two kinds: no single cause
    watch.update_accepted()  # an accepted update breaks the run of losses
    watch.job_lost("deadline")
    assert watch.why_stalled(0, "x") is None
    for _ in range(held_limit(2)):
        watch.update_accepted()
    assert "updates in a row made no new version" in watch.why_stalled(3, "x")
    watch.new_version()
    assert watch.why_stalled(4, "x") is None


@pytest.mark.parametrize("sets,start", [
    (["fleet.availability={up=1, down=1}", "inner.steps=20"],
     "fleet.availability.up: windows of mean 1 s, and every job takes at least 20 s"),
    ([f"fleet.availability_trace={ROOT}/experiments/results/fleets/avail-12.json",
      "fleet.trace_time_scale=1e-6"], "fleet.availability_trace: its longest window is 0.0167"),
])
def test_a_fleet_in_which_no_job_can_finish_is_refused_before_it_runs(sets, start):
    from fedlm.config_load import ConfigError

    with pytest.raises(ConfigError) as err:
        tiny_config(*sets)
    assert str(err.value).startswith(start) and "no job can finish" in str(err.value)


def test_a_run_whose_strategy_waits_for_a_worker_gone_for_good_stops_in_one_line(
        tmp_path, monkeypatch):
    # NoLoCo's rounds wait for the peers they drew; one left for good at 40 s. The loop
    # used to pop an empty clock (IndexError): now it says why it stopped
    monkeypatch.syspath_prepend(EXAMPLES)
    why, conn = _stalled(tmp_path, "strategy=noloco_example:NoLoCo", "workers=4",
                         "updates=20", "fleet.leave=[0, 40]")
    assert why.startswith("stalled at version ") and "gives none to the 3 free workers" in why
    sys.modules.pop("noloco_example", None)
