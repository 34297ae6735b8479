"""End to end through the real Flower simulation engine (Ray), as a user runs it."""

import json
import sqlite3
import statistics
import subprocess
import sys

import pytest

from fedlm import store
from tests.conftest import tiny_config
from tests.support import run_engine

pytestmark = pytest.mark.flower

TINY = ["model=tiny", "workers=3", "updates=4", "inner.steps=4", "inner.batch_size=4",
        "inner.warmup_steps=2", "eval.every=2", "eval.batches=2", "eval.batch_size=8",
        "data.seq_len=64", "profile=moderate"]


def fedlm_run(db, *extra):
    args = [sys.executable, "-m", "fedlm", "run", "--quiet", "--db", str(db)]
    for kv in [*TINY, *extra]:
        args += ["--set", kv]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def flower_run(tmp_path_factory):
    """One synchronous Flower run (the workers' AdamW states in node files, the default).
    Its twin with the states in Flower's context is the faults run below: each ends as
    the in-process engine does, so the transport and the state store change nothing."""
    db = tmp_path_factory.mktemp("e2e") / "runs.db"
    return db, fedlm_run(db)


def test_flower_run_learns_and_fills_the_run_store(flower_run):
    db, stdout = flower_run
    assert "validation perplexity" in stdout and "idle" in stdout
    conn = sqlite3.connect(db)
    status, updates = conn.execute("SELECT status, updates FROM runs WHERE id=1").fetchone()
    assert (status, updates) == ("finished", 4)
    losses = [l for (l,) in conn.execute("SELECT loss FROM metrics WHERE run_id=1 ORDER BY id")]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.3
    n_updates = conn.execute("SELECT COUNT(*) FROM updates WHERE run_id=1").fetchone()[0]
    assert n_updates == 4 * 3
    kinds = {k for (k,) in conn.execute("SELECT DISTINCT kind FROM intervals WHERE run_id=1")}
    assert kinds == {"download", "compute", "upload", "idle"}
    nodes = [n for (n,) in conn.execute("SELECT node_id FROM workers WHERE run_id=1")]
    assert len(set(nodes)) == 3 and all(nodes)


def test_flower_run_equals_the_in_process_engine(flower_run, tmp_path):
    # The transport changes nothing: the same config run in one process (in
    # virtual-completion order) ends with the same weights as on Ray actors. The
    # in-process engine is deterministic (test_engine), so the same seed gives the
    # same weights on Flower too.
    db, _ = flower_run
    cfg = tiny_config(*TINY)
    _, final, _ = run_engine(cfg, tmp_path / "local.db", evaluate=False)
    from fedlm.params import params_hash

    assert params_hash(final) == store.summarize(db, 1).final_hash


def test_slow_worker_makes_fast_ones_idle(flower_run):
    db, _ = flower_run
    s = store.summarize(db, 1)
    idle = [w.idle_fraction for w in s.workers]
    assert idle[-1] < 0.1 < idle[0]  # the slowest never waits; the fastest does


@pytest.fixture(scope="module")
def wall_run(tmp_path_factory):
    """One asynchronous Flower run on the wall clock (delayed Nesterov, DyLU) in which
    a hung ClientApp stalls for 8 s now and then, and its replay's output."""
    db = tmp_path_factory.mktemp("wall") / "wall.db"
    fedlm_run(db, "strategy=delayed-nesterov", "local_steps=dylu", "clock=wall", "updates=10",
              "eval.every=4", "faults.hang=0.15", "faults.hang_seconds=8",
              "reliability.deadline=5")  # a tiny job takes ~1 s; 5 s leaves room for load
    out = subprocess.run([sys.executable, "-m", "fedlm", "replay", "1", "--db", str(db)],
                         capture_output=True, text=True, timeout=600)
    return db, out


def test_async_flower_run_in_real_arrival_order_replays_exactly(wall_run):
    # clock=wall: updates are applied in the order Ray's actors really finish,
    # which no one can predict; the operation log alone must reproduce the run.
    db, out = wall_run
    assert out.returncode == 0, out.stdout + out.stderr
    assert "identical" in out.stdout
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT clock FROM runs").fetchone()[0] == "wall"
    steps = dict(conn.execute("SELECT worker, MAX(local_steps) FROM jobs GROUP BY worker"))
    assert steps[0] > steps[2]  # DyLU: the slow worker runs fewer local steps


def test_hung_worker_on_the_wall_clock_misses_its_deadline(wall_run):
    # Real time: a hung ClientApp stalls for 8 s; the engine gives up on it after
    # its 5 s deadline, goes on with the others, and ignores what comes later (the
    # run above, which replays exactly).
    db, _ = wall_run
    conn = sqlite3.connect(db)
    hung = conn.execute("SELECT status, reason FROM jobs WHERE fault='hang'").fetchall()
    assert ("lost", "deadline") in hung
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "finished"


FAULTS = ["strategy=async-sgd", "updates=8", "faults.crash=0.2", "faults.hang=0.1",
          "faults.nan=0.1", "faults.bad_size=0.1", "faults.duplicate=0.1", "faults.offline=0.1",
          "faults.offline_seconds=20", "network.compression=int4"]


def test_faults_act_the_same_in_flower_clientapps_as_in_process(tmp_path):
    # The ClientApp acts out the faults the server drew (crash, hang, NaN, a
    # missing tensor) on the 4-bit payload it really sends (with error feedback
    # kept in its state); the run goes on and ends exactly as the in-process one.
    # Its worker states (AdamW, error feedback) live in Flower's in-memory context
    # instead of node files: that must not change the run either.
    db = tmp_path / "faults.db"
    fedlm_run(db, *FAULTS, "inner.state_store=context")
    ref = tmp_path / "ref.db"
    from fedlm.runner import run_inprocess

    run_inprocess(tiny_config(*TINY, *FAULTS), str(ref))
    assert store.summarize(db, 1).final_hash == store.summarize(ref, 1).final_hash
    conn = sqlite3.connect(db)
    config = json.loads(conn.execute("SELECT config_json FROM runs").fetchone()[0])
    assert config["inner"]["state_store"] == "context"
    lost = dict(conn.execute("SELECT fault, reason FROM jobs WHERE status='lost'"))
    assert {lost.get("crash"), lost.get("hang"), lost.get("nan")} >= {"error", "deadline",
                                                                        "rejected"}
    kinds = {k for (k,) in conn.execute("SELECT kind FROM events")}
    assert {"fault_injected", "job_failed", "worker_offline"} <= kinds


def test_speed_emulation_makes_a_slow_worker_really_slow(tmp_path):
    # Wall clock, sync rounds: worker 1 is configured 8x slower than worker 0 and
    # pads its compute to match, so worker 0 really waits at every barrier.
    db = tmp_path / "emu.db"
    fedlm_run(db, "workers=2", "strategy=diloco", "clock=wall", "fleet.step_times=[1.0, 8.0]",
              "fleet.emulate_speed=true", "inner.steps=15", "updates=3")
    conn = sqlite3.connect(db)
    seconds = {0: [], 1: []}
    for worker, s in conn.execute("SELECT worker, compute_seconds FROM updates"):
        seconds[worker].append(s)
    # Each worker pads its own measured compute (the rule is pinned in test_worker.py),
    # and a job here computes for about 0.1 s, so one job that a loaded 2-core machine
    # stalls can outweigh the padding in a mean (CI once measured the fast worker's mean
    # above the slow one's). The median job is compared; without padding it is about 1.
    assert statistics.median(seconds[1]) / statistics.median(seconds[0]) > 2.5
    fast, slow = store.summarize(db, 1).workers
    # the fast worker waits at the barriers for the slow one's extra compute
    # (Flower's own per-message time, which varies with load, comes on top of both)
    assert fast.idle > slow.idle
    assert fast.idle > 0.25 * (slow.compute - fast.compute)
