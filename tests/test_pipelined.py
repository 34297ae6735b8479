"""examples/pipelined.py: asynchronous jobs whose transfers run behind the next job's
compute. Pinned by hand on a two-worker fleet with a fake clock (which model a job
starts from, what it waits for, when its update lands and how stale it is then);
through the engine: every update lands before the run ends, and on a fleet whose links
are slow it computes a larger share of the time than the same run without the
pipeline; a run trains, replays and resumes bit for bit."""

from pathlib import Path

import pytest

from fedlm.sim.fleet import JobTiming, Region, WorkerProfile
from tests.conftest import tiny_config
from tests.support import scalar as _p, scalar_update as _update, trains_replays_and_resumes
from tests.support import value as _v

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PIPELINED = "server=pipelined:PipelinedServer"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


class _Clock:
    """A job of ``steps`` steps: download 2 s, compute ``steps`` s, upload 3 s."""

    def timing(self, w, steps, index=0):
        return JobTiming(2.0, float(steps), 3.0)


def _server(*sets):
    from fedlm import servers

    cfg = tiny_config("strategy=async-sgd", "outer.lr=1.0", "workers=2", PIPELINED, *sets)
    server = servers.build(cfg)
    # its update (one number, 4 bytes in fp32 on the wire) up a 4 B/s link with 0.5 s
    # latency: 1.5 s
    link = Region("far", latency=0.5, down_bw=4.0, up_bw=4.0)
    server.start(_p(1.0), [WorkerProfile(w, 1.0, 0.0, link) for w in (0, 1)])
    return server


def _dispatch(server, w, steps):
    from fedlm.job import JobSpec

    start = server.start_of(w)
    job = JobSpec(job_id=0, worker=w, base_version=server.version, local_steps=steps, data_seed=0)
    timing = server.timing(server.send(job, start), _Clock(), 0)
    server.dispatched(w, server.version)
    return start, timing


def test_a_first_job_waits_for_its_model_and_hides_the_next_download():
    server = _server()
    start, t = _dispatch(server, 0, steps=5)
    assert _v(start) == 1.0
    # download exposed; the next model's download (2 s) behind the 5 s of compute
    assert (t.download, t.compute, t.upload, t.exchange, t.hidden) == (2.0, 5.0, 0.0, 0.0, 2.0)


def test_the_next_job_starts_prefetched_and_hides_the_upload_behind_its_compute():
    server = _server()
    _dispatch(server, 0, steps=5)
    server.new_version(_p(0.5))  # another worker's update made version 1 meanwhile
    server.accepted(0, None)
    assert server.staleness(0, 0) == 1  # its job started from version 0
    assert server.take(_update(0, 0.25)) is None  # on its way up, not applied yet
    (msg,) = server.take_messages()
    assert server.up_bytes == 4 and msg.seconds == pytest.approx(1.5) and msg.kind == "push"
    start, t = _dispatch(server, 0, steps=3)
    # it starts from the model prefetched when its first job was dispatched (version 0),
    # less its own update still on the wire: where its last job ended
    assert _v(start) == pytest.approx(1.0 - 0.25) and server.started[0] == 0
    # behind 3 s of compute: the 1.5 s upload and the 2 s download; 0.5 s exposed
    assert (t.download, t.compute, t.upload) == (0.0, 3.0, 0.0)
    assert t.hidden == pytest.approx(3.0) and t.exchange == pytest.approx(0.5)
    assert t.total == pytest.approx(3.5)


def test_without_the_carry_a_job_starts_from_the_prefetched_model_alone():
    server = _server("server=pipelined:PipelinedNoCarry")
    _dispatch(server, 0, steps=5)
    server.accepted(0, None)
    server.take(_update(0, 0.25))
    start, _ = _dispatch(server, 0, steps=3)
    assert _v(start) == 1.0


def test_an_update_is_applied_on_arrival_with_the_staleness_it_has_then():
    server = _server()
    _dispatch(server, 0, steps=5)
    server.accepted(0, None)
    server.take(_update(0, 0.25))
    (msg,) = server.take_messages()
    server.new_version(_p(0.9))  # two versions land while it travels
    server.new_version(_p(0.8))
    new, staleness = server.deliver(msg.key)
    assert staleness == 2
    assert _v(new) == pytest.approx(0.8 - 0.25 / 2)  # async SGD: θ − lr · g / N


def test_a_lost_job_s_worker_downloads_again_before_it_computes():
    server = _server()
    _dispatch(server, 1, steps=4)
    server.lose(1, job_id=0, reason="deadline")
    server.new_version(_p(0.7))
    start, t = _dispatch(server, 1, steps=4)
    assert _v(start) == pytest.approx(0.7) and t.download == 2.0


@pytest.mark.parametrize("sets, says", [
    (["strategy=diloco"], r"^server: runs an asynchronous strategy"),
    (["strategy=delayed-nesterov", "network.server_up=1e6"], r"^network.server_up: "),
    (["strategy=fedavg", "network.topology=ring"], r"^network.topology: "),
])
def test_a_config_it_cannot_serve_is_refused_in_one_line_before_the_run(sets, says):
    from fedlm.errors import ConfigError

    with pytest.raises(ConfigError, match=says) as err:
        tiny_config(PIPELINED, *sets)
    assert "\n" not in str(err.value)


SLOW_LINKS = ("strategy=delayed-nesterov", "local_steps=dylu-rtt", "profile=halos",
              "workers=4", "updates=100000", "local_step_budget=900", "inner.steps=3",
              "fleet.base_step_time=0.0005", "eval.every=100")


def _run(tmp_path, name, *sets):
    from fedlm import store
    from fedlm.runner import run_inprocess

    db = tmp_path / f"{name}.db"
    run_inprocess(tiny_config(*SLOW_LINKS, *sets), str(db))
    (run,) = store.list_runs(db)
    return db, run


def test_every_update_lands_before_the_run_ends_and_the_links_stop_idling_workers(tmp_path):
    import sqlite3

    from fedlm.store.yardstick import yardstick

    db, run = _run(tmp_path, "piped", PIPELINED)
    with sqlite3.connect(db) as conn:
        jobs, = conn.execute("SELECT COUNT(*) FROM updates WHERE run_id=1").fetchone()
        landed, last = conn.execute("SELECT COUNT(*), MAX(t_arrived) FROM transfers "
                                    "WHERE run_id=1").fetchone()
        steps, = conn.execute("SELECT SUM(local_steps) FROM updates WHERE run_id=1").fetchone()
    assert run["status"] == "finished" and steps == 900
    assert landed == jobs  # none left on the wire
    assert run["virtual_time"] == pytest.approx(last)  # the run ended as the last landed
    plain_db, plain = _run(tmp_path, "plain")
    piped, unpiped = yardstick(db, 1), yardstick(plain_db, 1)
    assert piped.goodput > unpiped.goodput + 0.1
    assert run["virtual_time"] < plain["virtual_time"]


def test_a_pipelined_run_trains_replays_and_resumes_bit_for_bit(tmp_path):
    trains_replays_and_resumes(tmp_path, PIPELINED, "strategy=delayed-nesterov",
                               "workers=3", "updates=6", "outer.buffer_size=2")
