"""sim.job_threads: the in-process backend runs several jobs at once, and the
run does not depend on how they were packed."""

import threading

import pytest

from fedlm.worker import train as worker
from fedlm.config_load import ConfigError
from fedlm.runner import run_inprocess
from fedlm.store.readers import operation_log
from tests.conftest import tiny_config


def _run(tmp_path, name: str, *overrides: str):
    db = tmp_path / f"{name}.db"
    run_id = run_inprocess(tiny_config(*overrides), str(db))
    log = operation_log(db, run_id)
    applied = [(u["job_id"], u["base_version"], u["applied_version"], u["update_hash"]) for u in log.updates]
    jobs = {j: (r["worker"], r["data_seed"], r["status"]) for j, r in log.jobs.items()}
    return log.run["final_hash"], log.run["virtual_time"], applied, jobs


@pytest.mark.parametrize("arm", [
    ("strategy=diloco",),
    ("strategy=delayed-nesterov", "local_steps=dylu", "fleet.preset=very"),
    ("strategy=async-sgd", "faults.crash=0.3", "faults.nan=0.2", "updates=6"),
], ids=["sync", "async-dylu", "async-faults"])
def test_packing_jobs_changes_nothing(tmp_path, arm):
    one = _run(tmp_path, "one", *arm)
    three = _run(tmp_path, "three", *arm, "sim.job_threads=3")
    assert one == three  # weights, virtual clock, operation log, jobs


def test_jobs_really_run_at_once(tmp_path, monkeypatch):
    # The first two jobs of the first round wait for each other: with one job
    # at a time the first would wait alone and the barrier break (after 60 s).
    barrier = threading.Barrier(2, timeout=60)
    threads = set()
    serve = worker.serve_job

    def meeting(params, states, job, cfg, *args, **kwargs):
        if job.job_id < 2:
            threads.add(threading.current_thread().name)
            barrier.wait()
        return serve(params, states, job, cfg, *args, **kwargs)

    monkeypatch.setattr("fedlm.inprocess.serve_job", meeting)
    _run(tmp_path, "two", "strategy=diloco", "updates=1", "sim.concurrent_jobs=2")
    assert len(threads) == 2 and not barrier.broken


def test_job_threads_must_be_positive():
    with pytest.raises(ConfigError, match=r"sim\.job_threads"):
        tiny_config("sim.job_threads=0")
