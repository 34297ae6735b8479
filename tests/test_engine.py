"""The engine with an in-process transport: ordering, idle time, failures."""

import sqlite3
from dataclasses import replace

import pytest
import torch

from fedlm.sim import fleet
from fedlm.engine import JobResult
from fedlm.inprocess import InProcessTransport
from fedlm.params import num_bytes, params_hash
from fedlm.store import summarize
from tests.conftest import tiny_config
from tests.support import run_engine


def test_result_does_not_depend_on_real_arrival_order(tmp_path):
    cfg = tiny_config("strategy=diloco")
    hashes = {params_hash(run_engine(cfg, tmp_path / "a.db",
                                     InProcessTransport(cfg, arrival_seed=s), False)[1])
              for s in (None, 1, 2)}
    assert len(hashes) == 1


def test_sync_idle_time_matches_the_profile_arithmetic(tmp_path):
    cfg = tiny_config("fleet.step_times=[1.0, 2.0, 4.0]", "fleet.jitter=0.0", "updates=3")
    engine, final, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    comm = 2 * (fleet.REGIONS["local"].latency
                + num_bytes(final) / fleet.REGIONS["local"].down_bw)
    job_time = [cfg.inner.steps * st + comm for st in (1.0, 2.0, 4.0)]
    rounds = 3
    assert engine.now == pytest.approx(rounds * max(job_time))
    s = summarize(tmp_path / "r.db", run_id)
    for w, expected in zip(s.workers, job_time):
        # fast workers wait for the slowest at every barrier; the slowest never waits
        assert w.idle == pytest.approx(rounds * (max(job_time) - expected))
        assert w.compute == pytest.approx(rounds * cfg.inner.steps * w.step_time)
        assert w.jobs == rounds
    assert s.workers[2].idle == 0.0
    assert s.workers[0].idle_fraction == pytest.approx(1 - job_time[0] / max(job_time))


def test_run_store_holds_the_operation_log(tmp_path):
    cfg = tiny_config()
    engine, final, run_id = run_engine(cfg, tmp_path / "r.db")
    conn = sqlite3.connect(tmp_path / "r.db")
    rows = conn.execute("SELECT seq, worker, base_version, received_version, applied_version,"
                        " staleness FROM updates WHERE run_id=? ORDER BY seq",
                        (run_id,)).fetchall()
    assert len(rows) == cfg.updates * cfg.workers
    for seq, worker, base, received, applied, staleness in rows:
        assert staleness == 0 and base == received and applied == base + 1
    kinds = {k for (k,) in conn.execute("SELECT DISTINCT kind FROM intervals")}
    assert kinds == {"download", "compute", "upload", "idle"}
    versions = [v for (v,) in conn.execute("SELECT version FROM metrics ORDER BY id")]
    assert versions == [0, 2, 4]


class FlakyTransport(InProcessTransport):
    """Job 1's ClientApp crashes before finishing; job 4's update comes back NaN."""

    def submit(self, job, params):
        if job.job_id == 1:
            self.ready.append(JobResult(1, None, error="flower error 3: message expired"))
        else:
            super().submit(job, params)

    def collect(self, timeout):
        out = []
        for r in super().collect(timeout):
            if r.job_id == 4:
                bad = dict(r.outer_grad)
                first = next(iter(bad))
                bad[first] = torch.full_like(bad[first], float("nan"))
                r = replace(r, outer_grad=bad)
            out.append(r)
        return out


def test_lost_and_bad_updates_are_logged_redone_and_never_applied(tmp_path):
    cfg = tiny_config()
    engine, final, run_id = run_engine(cfg, tmp_path / "r.db", FlakyTransport(cfg), False)
    assert engine.version == cfg.updates
    assert all(torch.isfinite(t).all() for t in final.values())
    conn = sqlite3.connect(tmp_path / "r.db")
    events = conn.execute("SELECT job_id, detail FROM events WHERE kind='job_failed'"
                          " ORDER BY job_id").fetchall()
    assert [e[0] for e in events] == [1, 4]
    assert "expired" in events[0][1] and "NaN" in events[1][1]
    applied_jobs = {j for (j,) in conn.execute("SELECT job_id FROM updates")}
    assert not applied_jobs & {1, 4}
    assert len(applied_jobs) == cfg.updates * cfg.workers  # the lost work was redone


def test_jobs_in_flight_when_the_run_ends_are_cancelled_not_running(tmp_path):
    from fedlm.replay import replay

    # async: version 5 comes while the other workers' jobs are still computing
    cfg = tiny_config("strategy=async-sgd", "updates=5", "fleet.step_times=[1.0, 2.0, 4.0]")
    engine, _, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    in_flight = sorted(engine.in_flight)
    assert in_flight
    conn = sqlite3.connect(tmp_path / "r.db")
    assert conn.execute("SELECT job_id, status, reason, end_op FROM jobs WHERE status NOT IN"
                        " ('done', 'lost') ORDER BY job_id").fetchall() == [
        (j, "cancelled", "run finished", None) for j in in_flight]
    assert replay(tmp_path / "r.db", run_id).identical  # replay walks only their dispatch
