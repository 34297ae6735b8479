"""The timer seam (issue 60): a server kind asks the run's clock for a wake-up
(``Server.wake_in``) and gets ``on_timer`` when it is due, in the run, its replay and
its resume, as an operation of the run log (a ``timer`` event), never as a message.
A round that closes at a fixed virtual period lands as one plug-in file
(examples/periodic_rounds.py, written from docs/strategies.md and docs/architecture.md:
a server kind with a setting of its own, ``[server] period``) with no change to fedlm,
and serves diloco as it is."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from pathlib import Path

import pytest

from fedlm import servers
from tests.support import trains_replays_and_resumes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def periodic(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    sys.modules.pop("periodic_rounds", None)


def test_a_round_of_a_fixed_period_is_one_plug_in_file(tmp_path, periodic):
    ref = trains_replays_and_resumes(tmp_path, "server.kind=periodic_rounds:PeriodicRounds",
                                     "server.period=25", "profile=very", "workers=3",
                                     "updates=6", stop_at=3)
    with sqlite3.connect(ref) as conn:
        rang = [json.loads(d) for (d,) in conn.execute(
            "SELECT detail FROM events WHERE kind='timer' ORDER BY id")]
        late = conn.execute("SELECT COUNT(*) FROM updates WHERE staleness > 0").fetchone()[0]
        messages = conn.execute("SELECT COUNT(*) FROM transfers").fetchone()[0]
    assert len(rang) >= 3 and messages == 0  # wake-ups, not 0-byte messages
    assert [r["t_due"] for r in rang] == pytest.approx([25.0 * (k + 1)
                                                        for k in range(len(rang))])
    assert all(r["t_due"] - r["t_set"] == pytest.approx(25.0) for r in rang)
    assert late > 0  # the very fleet's slowest worker missed periods: its work came late


@pytest.mark.parametrize("sets, says", [
    (("server.period=0",), "server.period: must be seconds in (0, inf)"),
    (("server.period=fast",), "server.period: expected float"),
    (("server.periods=3",), "server.periods: not a setting of server "
                            "'periodic_rounds:PeriodicRounds' (its settings: period)"),
    (("strategy=delayed-nesterov",), "closes synchronous rounds")])
def test_a_kind_s_own_settings_are_checked_as_the_config_loads(periodic, sets, says):
    from fedlm.errors import ConfigError
    from tests.conftest import tiny_config

    with pytest.raises(ConfigError, match=re.escape(says)):
        tiny_config("server.kind=periodic_rounds:PeriodicRounds", *sets)


def test_a_wake_up_in_no_time_or_in_nonsense_is_refused():
    from tests.conftest import tiny_config

    kind = servers.build(tiny_config())
    assert kind.wake_in(0.0) == 0 and kind.wake_in(2.5) == 1  # keys shared with messages
    assert [a.seconds for a in kind.take_alarms()] == [0.0, 2.5] and kind.take_alarms() == []
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="a wake-up is due in seconds >= 0"):
            kind.wake_in(bad)
    with pytest.raises(KeyError, match="asks for none"):
        kind.on_timer(7)


def test_a_run_whose_deadlines_came_as_messages_still_replays(tmp_path, monkeypatch):
    """An older fedlm sent the semi-synchronous round's deadline as a 0-byte message to
    the server itself (a transfer op): such a log replays to its hash, the same wake-up
    under the same key."""
    from fedlm.replay import replay

    monkeypatch.syspath_prepend(str(EXAMPLES))
    ref = trains_replays_and_resumes(tmp_path, "strategy=semi_sync:SemiSyncFill",
                                     "profile=very", "workers=3", "fleet.jitter=0.3",
                                     "updates=5", "outer.deadline_k=0", stop_at=3)
    with sqlite3.connect(ref) as conn:  # the log as the older fedlm wrote it
        rows = [json.loads(d) for (d,) in conn.execute(
            "SELECT detail FROM events WHERE kind='timer'")]
        conn.executemany(
            "INSERT INTO transfers (run_id, op, key, kind, region, bytes, t_sent, t_arrived,"
            " staleness, version) VALUES (1, ?, ?, 'deadline', -1, 0, ?, ?, 0, 0)",
            [(r["op"], r["key"], r["t_set"], r["t_due"]) for r in rows])
        conn.execute("DELETE FROM events WHERE kind='timer'")
    assert rows and replay(ref, 1).identical
    sys.modules.pop("semi_sync", None)


@pytest.mark.flower
def test_on_flower_s_wall_clock_a_wake_up_rings_in_real_seconds_and_replays(tmp_path):
    """The same plug-in on Flower's simulation engine with clock = wall: each period is
    real seconds, when it rang is in the run log, and the replay ends on the run's weights."""
    import os
    import subprocess

    db, env = tmp_path / "wall.db", {**os.environ, "PYTHONPATH": str(EXAMPLES)}
    sets = ["server.kind=periodic_rounds:PeriodicRounds", "server.period=2", "clock=wall",
            "model=tiny", "workers=3", "updates=4", "inner.steps=4", "inner.batch_size=4",
            "eval.batches=2", "data.seq_len=64", "profile=very"]
    run = subprocess.run([sys.executable, "-m", "fedlm", "run", "--quiet", "--db", str(db),
                          *[a for s in sets for a in ("--set", s)]],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    with sqlite3.connect(db) as conn:
        rang = [json.loads(d) for (d,) in conn.execute(
            "SELECT detail FROM events WHERE kind='timer' ORDER BY id")]
    assert rang and all(r["t_due"] - r["t_set"] == pytest.approx(2.0) for r in rang)
    again = subprocess.run([sys.executable, "-m", "fedlm", "replay", "1", "--db", str(db)],
                           capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and "identical" in again.stdout, again.stdout + again.stderr


IDLE = '''
"""A kind that gives no job after the first round and wakes itself for ever."""
from fedlm.servers import Server


class Idle(Server):
    def start(self, params, fleet):
        super().start(params, fleet)
        self.wake_in(1.0)

    def wants_job(self, worker, version):
        return version == 0 and super().wants_job(worker, version)

    def on_timer(self, key):
        self.wake_in(1.0)
        return None
'''


def test_a_timer_that_sets_itself_for_ever_with_no_job_stops_the_run_in_one_line(tmp_path,
                                                                                monkeypatch):
    from fedlm import store
    from fedlm.engine import EngineError
    from fedlm.runner import run_inprocess
    from tests.conftest import tiny_config

    (tmp_path / "idle_kind.py").write_text(IDLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "idle.db"
    with pytest.raises(EngineError, match=r"no progress at version 1: the server kind's last "
                                          r"50 wake-ups rang with no job in flight"):
        run_inprocess(tiny_config("server=idle_kind:Idle", "workers=2", "updates=3"), str(db))
    (run,) = store.list_runs(db)
    assert run["status"] == "failed"
    sys.modules.pop("idle_kind", None)


def test_a_wake_up_in_no_time_that_sets_itself_again_stops_the_run_in_one_line(tmp_path,
                                                                              monkeypatch):
    from fedlm.engine import EngineError
    from fedlm.runner import run_inprocess
    from tests.conftest import tiny_config

    (tmp_path / "spin_kind.py").write_text(IDLE.replace("Idle", "Spin").replace(
        "self.wake_in(1.0)\n        return None", "self.wake_in(0.0)\n        return None"))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EngineError, match=r"wake-ups rang at one instant \(1 s\): a wake-up "
                                          r"in 0 s that sets itself again"):
        run_inprocess(tiny_config("server=spin_kind:Spin", "workers=2", "updates=3"),
                      str(tmp_path / "spin.db"))
    sys.modules.pop("spin_kind", None)
