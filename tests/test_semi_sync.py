"""examples/semi_sync.py: rounds that close at a quorum or at a deadline of median + k x
MAD of the recent reply times, their stragglers' work merged into the next round.
Pinned by hand: the deadline's numbers; a round cut by its timer closes with the
replies it has and the straggler's reply joins the next round; a timer of a round
closed already does nothing. Through the engine: timers fire and a run replays and
resumes bit for bit."""

from pathlib import Path

import pytest

from fedlm.sim.fleet import JobTiming, Region, WorkerProfile
from tests.conftest import tiny_config
from tests.support import scalar as _p, scalar_update as _update, trains_replays_and_resumes
from tests.support import value as _v

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SEMI = "strategy=semi_sync:SemiSyncFill"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_the_deadline_is_the_median_plus_k_mads_with_a_floor():
    from semi_sync import deadline_of

    # median 13; |d − 13| = 3, 1, 1, 17: MAD 2; 13 + 2 · 2
    assert deadline_of([10.0, 12.0, 14.0, 30.0], 2.0) == pytest.approx(17.0)
    # equal durations: the MAD counts as 5% of the median, else every later reply is cut
    assert deadline_of([10.0, 10.0, 10.0], 2.0) == pytest.approx(11.0)
    assert deadline_of([8.0], 0.0) == pytest.approx(8.0)


class _Clock:
    """Worker w's job takes 10 + w seconds; every job of a round is handed out at once."""

    now = 0.0

    def timing(self, w, steps, index=0):
        return JobTiming(0.0, 10.0 + w, 0.0)


def _server():
    from fedlm import servers

    cfg = tiny_config(SEMI, "workers=3", "outer.lr=1.0", "outer.momentum=0.0",
                      "outer.nesterov=false", "outer.deadline_k=0")
    server = servers.build(cfg)
    link = Region("near", 0.0, 1e12, 1e12)
    server.start(_p(1.0), [WorkerProfile(w, 1.0, 0.0, link) for w in range(3)])
    return server


def _round(server, job_ids, workers=(0, 1, 2)):
    """``workers`` (the free ones) offered and dispatched; returns the round's jobs."""
    from fedlm.job import JobSpec

    server.strategy.rounds.draw(list(workers))
    jobs = {}
    for w, job_id in zip(workers, job_ids):
        assert server.wants_job(w, server.version)
        job = JobSpec(job_id=job_id, worker=w, base_version=server.version, local_steps=1,
                      data_seed=0)
        server.timing(server.send(job, server.start_of(w)), _Clock(), 0)
        server.dispatched(w, server.version)
        jobs[w] = job
    return jobs


def _reply(server, job, g):
    u = _update(job.worker, g)
    u = type(u)(**{**u.__dict__, "job_id": job.job_id, "base_version": job.base_version})
    server.accepted(job.worker, job)
    new = server.take(u)
    if new is not None:
        server.new_version(new)
    return new


def test_a_round_cut_by_its_deadline_closes_with_what_it_has_and_the_straggler_joins_the_next():
    server = _server()
    first = _round(server, [0, 1, 2])
    assert server.take_alarms() == []  # round 0: no reply time seen, no deadline
    for w, g in ((0, 0.3), (1, 0.6), (2, 0.9)):
        new = _reply(server, first[w], g)
    assert _v(new) == pytest.approx(1.0 - 0.6)  # the mean of the three
    second = _round(server, [3, 4, 5])
    (timer,) = server.take_alarms()  # a wake-up of the run's clock, no message
    # durations 10, 11, 12: median 11, MAD 1, k = 0: 11 s
    assert timer.seconds == pytest.approx(11.0) and server.take_messages() == []
    assert _reply(server, second[0], 0.2) is None  # the barrier holds
    assert _reply(server, second[1], 0.4) is None
    new = server.on_timer(timer.key)  # worker 2 is not in: the round closes without it
    assert _v(new) == pytest.approx(0.4 - 0.3)
    server.new_version(new)
    third = _round(server, [6, 7], workers=(0, 1))  # worker 2 still computes
    assert _reply(server, second[2], 0.9) is None  # late: carried into the open round
    assert _reply(server, third[0], 0.3) is None
    new = _reply(server, third[1], 0.3)
    # the round's two replies and worker 2's late one, token-weighted alike
    assert _v(new) == pytest.approx(0.1 - (0.3 + 0.3 + 0.9) / 3)


def _second_round_armed(server):
    """A first round whose three replies are in (each 10-12 s: the history), then the
    second round dispatched: its jobs and its timer."""
    first = _round(server, [0, 1, 2])
    for w in range(3):
        _reply(server, first[w], 0.3)
    second = _round(server, [3, 4, 5])
    (timer,) = server.take_alarms()
    return second, timer


def test_a_reply_s_time_counts_from_its_round_s_opening():
    """A worker that joins mid-round (fill gives it the time left): its reply's time is
    the wait before its job plus the job, not the job alone."""
    from fedlm.job import JobSpec

    server, clock = _server(), _Clock()
    clock.now = 20.0
    server.strategy.rounds.draw([0, 1])
    for w in (0, 1):
        job = JobSpec(job_id=w, worker=w, base_version=0, local_steps=1, data_seed=0)
        server.timing(server.send(job, server.start_of(w)), clock, 0)
        server.dispatched(w, 0)
    clock.now = 25.0
    job = JobSpec(job_id=2, worker=2, base_version=0, local_steps=1, data_seed=0)
    server.timing(server.send(job, server.start_of(2)), clock, 0)
    assert server.timed == {0: 10.0, 1: 11.0, 2: 5.0 + 12.0}


def test_a_timer_of_a_round_that_closed_at_its_quorum_does_nothing():
    server = _server()
    second, timer = _second_round_armed(server)
    for w in range(3):
        new = _reply(server, second[w], 0.3)
    assert new is not None
    version = server.version
    assert server.on_timer(timer.key) is None and server.version == version


def test_a_round_with_no_reply_at_its_deadline_waits_for_one_then_closes():
    """Not a restart: its stragglers still compute, and fill would give a restarted round
    of the same version no steps while they do (a run of the churn trace stalled so)."""
    server = _server()
    second, timer = _second_round_armed(server)
    version = server.version
    assert server.on_timer(timer.key) is None  # nothing in yet: it waits on
    assert server.version == version and server.strategy.rounds.failed_rounds == 0
    new = _reply(server, second[1], 0.4)  # the first reply closes it: 0 and 2 are cut
    assert new is not None and _v(new) == pytest.approx(0.7 - 0.4)
    assert _reply(server, second[0], 0.1) is None  # late: carried into the next round


def test_a_checkpoint_of_before_rounds_loads_overdue_and_closes_at_the_next_reply():
    """The server kept the round's jobs (``out``), its replies and its overdue flag
    itself before the strategy's Rounds did: such a checkpoint, taken while a round
    waits past its deadline, resumes waiting and closes at its next reply."""
    server = _server()
    second, timer = _second_round_armed(server)
    assert server.on_timer(timer.key) is None  # nothing in yet: it waits on
    state = server.state_dict()
    old = {**{k: v for k, v in state.items() if k != "jobs"}, "rounds": 1, "in_round": 0,
           "overdue": True, "out": {w: job.job_id for w, job in second.items()},
           "strategy": {k: v for k, v in state["strategy"].items() if k != "overdue"}}
    again = _server()
    again.load_state_dict(old)
    assert again.jobs == old["out"] and again.strategy.rounds.overdue
    new = _reply(again, second[1], 0.4)  # the first reply closes it: 0 and 2 are cut
    assert new is not None and _v(new) == pytest.approx(0.7 - 0.4)


@pytest.mark.parametrize("setting, says", [
    ("server.deadline_k=-1", "server.deadline_k: must be a number >= 0"),
    ("server.deadline_k=inf", "server.deadline_k: must be a finite number"),
    ("server.deadline_k=nan", "server.deadline_k: must be a finite number"),
    ("server.deadline_window=2.5", "server.deadline_window: expected int"),
    ("server.deadline_window=0", "server.deadline_window: must be >= 1"),
    ("outer.deadline_k=-1", "server.deadline_k: must be a number >= 0"),  # the old spelling
    ("outer.deadline_window=0", "server.deadline_window: must be >= 1")])
def test_a_bad_setting_is_a_one_line_config_error(setting, says):
    from fedlm.errors import ConfigError

    with pytest.raises(ConfigError, match=says) as err:
        tiny_config(SEMI, setting)
    assert "\n" not in str(err.value)


def test_its_server_beside_another_strategy_is_refused_before_a_run_is_stored():
    from fedlm.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^server: semi_sync:DeadlineServer serves "
                                          r"semi_sync:SemiSyncFill .*, not 'diloco'$"):
        tiny_config("server=semi_sync:DeadlineServer", "strategy=diloco")


def test_a_semi_synchronous_run_cuts_rounds_replays_and_resumes_bit_for_bit(tmp_path):
    import sqlite3

    ref = trains_replays_and_resumes(tmp_path, SEMI, "profile=very", "workers=4",
                                     "fleet.jitter=0.3", "updates=8", "server.deadline_k=0",
                                     stop_at=4)
    with sqlite3.connect(ref) as conn:
        timers, = conn.execute("SELECT COUNT(*) FROM events WHERE kind='timer'").fetchone()
        messages, = conn.execute("SELECT COUNT(*) FROM transfers").fetchone()
        held, = conn.execute("SELECT COUNT(*) FROM jobs j JOIN updates u ON u.job_id = j.job_id "
                             "AND u.run_id = j.run_id WHERE u.staleness > 0").fetchone()
    assert timers >= 5 and messages == 0  # every round after the first sets one
    assert held > 0  # some straggler's work landed a round late


def test_with_no_deadline_reached_it_is_diloco_fill_bit_for_bit(tmp_path):
    """A churning trace fleet (workers come back and join a round mid-way) and a deadline
    never reached: the same rounds, the same final weights as ``diloco-fill``."""
    from fedlm import store
    from fedlm.runner import run_inprocess

    traces = ROOT / "experiments" / "results" / "fleets"
    churn = ("workers=8", "updates=100000", "local_step_budget=300", "inner.steps=10",
             f"fleet.device_trace={traces / 'device-11.json'}",
             f"fleet.availability_trace={traces / 'avail-12.json'}",
             "fleet.trace_time_scale=0.02")
    hashes = []
    arms = (("semi", (SEMI, "server.deadline_k=1000")), ("fill", ("strategy=diloco-fill",)))
    for name, sets in arms:
        db = tmp_path / f"{name}.db"
        run_inprocess(tiny_config(*sets, *churn), str(db))
        (run,) = store.list_runs(db)
        hashes.append(run["final_hash"])
    assert hashes[0] == hashes[1]
