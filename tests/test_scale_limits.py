"""Runs at a scale the machine cannot hold are refused up front; a large run stops
on SIGTERM within seconds (issue 26: 10,000 workers grew to 5.7 GB in 200 s
without two updates, and SIGTERM did not stop them)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedlm import config_load, presets
from fedlm.config import Config
from fedlm.errors import ConfigError
from fedlm.sim import memory
from tests._cli import assert_refused, no_work_fixture, run_cli  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("preset", sorted(presets.PRESETS))
def test_the_parameter_count_without_torch_is_the_models(preset):
    from fedlm import model

    assert presets.parameter_count(preset, 64) == model.num_parameters(model.build(preset, 64, 0))


def test_a_run_that_cannot_fit_is_refused_before_it_starts(no_work, monkeypatch):
    monkeypatch.setattr(memory, "available", lambda: 16 * 10**9)
    db = no_work / "big.db"
    rc, out, err = run_cli(["run", "--set", "workers=10000", "--set", "data.partition=iid",
                            "--db", str(db)])
    assert_refused(rc, out, err, "memory: this run needs about 150.0 GB (10000 jobs in flight")
    assert "max_in_flight=" in err and "more than the 16.0 GB" in err
    assert not db.exists()
    # what it proposes fits
    fit = int(err.split("max_in_flight=")[1].split()[0])
    memory.check_fits(config_load.load(None, ["workers=10000", "data.partition=iid",
                                              f"max_in_flight={fit}"]))


def test_ordinary_runs_fit_a_small_machine(monkeypatch):
    monkeypatch.setattr(memory, "available", lambda: 8 * 10**9)
    for backend in ("flower", "inprocess"):
        memory.check_fits(Config(), backend)
        memory.check_fits(config_load.load(None, ["workers=64", "model=20m",
                                                  "data.partition=iid"]), backend)
    with pytest.raises(ConfigError, match="inner.state_store=disk"):  # states in memory
        memory.check_fits(config_load.load(None, ["workers=3000", "model=20m",
                                                  "data.partition=iid", "max_in_flight=8",
                                                  "reliability.checkpoint_every=0"]),
                          "inprocess")


def _started(db: Path) -> bool:
    """The run's model is stored: the engine starts (its rows of jobs are written only
    once the round is handed out)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            row = conn.execute("SELECT num_parameters FROM runs").fetchone()
    except sqlite3.OperationalError:  # not created yet
        return False
    return row is not None and row[0] is not None


def test_sigterm_stops_a_run_of_thousands_of_workers_within_seconds(tmp_path):
    """Handing out the first round of 2,000 jobs (in one process each runs as it is
    handed out) took minutes with no look at the stop signal."""
    db = tmp_path / "big.db"
    args = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", "inprocess",
            "--db", str(db)]
    for kv in ("workers=2000", "model=tiny", "data.partition=iid", "data.seq_len=64"):
        args += ["--set", kv]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not _started(db):  # bounded: until the engine starts
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the run did not start within 180 s"
            time.sleep(0.2)
        time.sleep(3.0)  # into the first round (a fixed delay, not a synchronisation)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM did not stop the run within 30 s")
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        proc.stdout.close()
    assert took < 5.0, f"stopped {took:.1f} s after SIGTERM"
    assert proc.returncode == 130, out[-3000:]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"


def test_a_job_size_no_machine_can_train_is_refused_before_the_run_is_stored(no_work):
    """`local_steps = fill` at a speed ratio of 10^5 gave the fast worker a job of
    3,000,000 steps whose batches (24 GB) were built at once: the OOM killer, the run
    left running. The first round's sizes are derived before the run, and checked."""
    db = no_work / "f.db"
    sets = ["--set", "strategy=diloco-fill", "--set", "fleet.step_times=[0.001, 100]"]
    rc, out, err = run_cli(["run", *sets, "--db", str(db)])
    assert_refused(rc, out, err, "local_steps fill: worker 0's first job would run "
                                 "3,000,000 inner steps")
    assert "more than the 1,000,000 a job may run" in err and not db.exists()
    rc, out, err = run_cli(["run", "--set", "strategy=diloco-fill", "--set",
                            "fleet.step_times=[0.001, 20]", "--set", "inner.batch_size=512",
                            "--db", str(db)])
    assert_refused(rc, out, err, "whose batches take 317.0 GB, more than half the")


def test_the_first_jobs_derived_before_the_run_are_the_ones_the_engine_hands_out(tmp_path):
    from fedlm.runner import run_inprocess
    from fedlm.sim import job_sizes
    from tests.conftest import tiny_config

    for sets in (("strategy=diloco-fill", "fleet.step_times=[0.5, 1, 3]"),
                 ("strategy=diloco-dylu", "profile=halos", "workers=3"),
                 ("strategy=delayed-nesterov", "local_steps=fill-sizes", "profile=very")):
        cfg = tiny_config(*sets, "updates=1")
        db = tmp_path / f"{sets[0]}.db"
        run_inprocess(cfg, str(db))
        with sqlite3.connect(db) as conn:
            handed = [s for (s,) in conn.execute(
                "SELECT local_steps FROM jobs WHERE dispatch_op IS NOT NULL ORDER BY job_id "
                f"LIMIT {cfg.workers}")]
        assert sorted(handed) == sorted(job_sizes.first_jobs(cfg)), sets


def test_a_job_a_process_limit_cannot_hold_is_refused_before_the_run_is_stored(tmp_path):
    """Under `ulimit -v 4000000`, fill's 900,000-step job (6.9 GiB of batches, under the
    step cap and under half of the machine's free memory) failed with MemoryError and
    the run ended `finished`. The process's limit counts as the memory there is."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4_000_000 * 1024, 4_000_000 * 1024))

    db = tmp_path / "m.db"
    proc = subprocess.run(
        [sys.executable, "-m", "fedlm", "run", "--backend", "inprocess", "--set", "model=tiny",
         "--set", "strategy=diloco-fill", "--set", "fleet.step_times=[0.0001, 3]",
         "--db", str(db)], preexec_fn=limit, capture_output=True, text=True, timeout=120,
        cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "worker 0's first job would run 900,000 inner steps" in proc.stderr
    assert "a process of this run may use here" in proc.stderr
    assert not db.exists()


def test_the_process_limit_is_part_of_the_room(monkeypatch):
    import resource

    from fedlm.sim import room

    monkeypatch.setattr(resource, "getrlimit", lambda which: (3 * room.PROCESS_ADDRESS_SPACE,
                                                              resource.RLIM_INFINITY))
    assert room.process_room() == 2 * room.PROCESS_ADDRESS_SPACE
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    assert room.process_room() == room.UNKNOWN


def test_a_run_whose_job_runs_out_of_memory_fails_in_one_line(tmp_path, monkeypatch):
    """A job that fails for memory anyway (the estimate is a lower bound) ends the run
    `failed` with what to change: the same sizes would fail again, and a run that drops
    them (49% of compute never applied) is not one that finished."""
    from fedlm import inprocess, store
    from fedlm.engine import EngineError
    from fedlm.runner import run_inprocess
    from tests.conftest import tiny_config

    serve = inprocess.serve_job

    def serve_or_run_out(params, states, job, cfg, **kw):
        if job.worker == 1 and job.job_id > 1:
            raise MemoryError("Unable to allocate 6.92 GiB for an array")
        return serve(params, states, job, cfg, **kw)

    monkeypatch.setattr(inprocess, "serve_job", serve_or_run_out)
    db = tmp_path / "oom.db"
    with pytest.raises(EngineError, match=r"worker 1's job \d+ \(3 inner steps\) ran out of "
                                          r"memory \(MemoryError: Unable to allocate 6.92 GiB"):
        run_inprocess(tiny_config("updates=4"), str(db))
    run = store.list_runs(str(db))[0]
    assert run["status"] == "failed" and "ran out of memory" in run["error"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT reason FROM jobs WHERE status='lost'").fetchall() == [("memory",)]


@pytest.mark.parametrize("error, oom", [
    ("MemoryError: Unable to allocate 6.92 GiB", True),
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate "
     "memory: you tried to allocate 7430400000 bytes", True),
    ("RuntimeError: injected crash", False),
    ("ValueError: a plug-in's bad value", False),
])
def test_which_errors_say_a_job_ran_out_of_memory(error, oom):
    from fedlm.engine.replies import out_of_memory

    assert out_of_memory(error) is oom
