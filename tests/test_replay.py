"""A run and its replay from the operation log end with equal weight hashes."""

import subprocess
import sys

import pytest

from fedlm.replay import replay
from tests.conftest import tiny_config
from tests.support import run_engine
from tests.test_engine import FlakyTransport
from fedlm.inprocess import InProcessTransport

HETERO = ["fleet.step_times=[1.0, 2.0, 4.0]", "fleet.jitter=0.2"]


@pytest.mark.parametrize("strategy", ["diloco", "delayed-nesterov", "fedbuff", "polythres"])
def test_virtual_run_replays_exactly(tmp_path, strategy):
    cfg = tiny_config(*HETERO, f"strategy={strategy}", "updates=6", "local_steps=dylu")
    _, final, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    result = replay(tmp_path / "r.db", run_id)
    assert result.identical and result.mismatched_updates == 0
    assert result.versions == 6


@pytest.mark.parametrize("strategy", ["async-nesterov", "delayed-nesterov"])
def test_arrival_ordered_run_replays_exactly(tmp_path, strategy):
    # clock=wall takes replies in the order they arrive; a shuffled transport
    # makes that order arbitrary. The log alone must reproduce it (delayed Nesterov:
    # with the adaptive grace window deciding on real arrival times).
    cfg = tiny_config(*HETERO, f"strategy={strategy}", "updates=7", "clock=wall",
                      "local_steps=dylu")
    for seed in (3, 4):
        _, _, run_id = run_engine(cfg, tmp_path / "w.db", InProcessTransport(cfg, seed), False)
        assert replay(tmp_path / "w.db", run_id).identical


def test_replay_with_lost_jobs(tmp_path):
    cfg = tiny_config(*HETERO, "strategy=diloco")
    _, _, run_id = run_engine(cfg, tmp_path / "r.db", FlakyTransport(cfg), False)
    assert replay(tmp_path / "r.db", run_id).identical


def test_replay_keeps_only_versions_still_needed(tmp_path):
    cfg = tiny_config("fleet.step_times=[1.0, 1.1, 1.2]", "fleet.jitter=0.0",
                      "strategy=async-sgd", "updates=12")
    _, _, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    result = replay(tmp_path / "r.db", run_id)
    assert result.identical and result.max_versions_held <= cfg.workers + 1


def test_replay_cli(tmp_path):
    cfg = tiny_config("strategy=async-sgd", "updates=3")
    _, _, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    out = subprocess.run([sys.executable, "-m", "fedlm", "replay", str(run_id), "--db",
                          str(tmp_path / "r.db")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "identical" in out.stdout


def test_a_pretrained_runs_replay_reports_its_start_then_its_operations(tmp_path):
    from fedlm.runner import run_inprocess

    cfg = tiny_config("strategy=async-sgd", "updates=3", "init.pretrain_steps=8")
    run_id = run_inprocess(cfg, str(tmp_path / "r.db"))
    calls = []
    result = replay(tmp_path / "r.db", run_id, lambda d, t: calls.append(("ops", d, t)),
                    lambda d, t: calls.append(("start", d, t)))
    assert result.identical
    phases = [phase for phase, _, _ in calls]
    first_op = phases.index("ops")
    assert set(phases[:first_op]) == {"start"} and set(phases[first_op:]) == {"ops"}
    start, ops = calls[:first_op], calls[first_op:]
    # each phase says when it begins (0 done) and ends at its own total
    assert start[0] == ("start", 0, 8) and start[-1] == ("start", 8, 8)
    assert ops[0][1] == 0 and ops[-1][1] == ops[-1][2] == len(ops) - 1

    out = subprocess.run([sys.executable, "-m", "fedlm", "replay", str(run_id), "--db",
                          str(tmp_path / "r.db")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    said = out.stderr.replace("\r", "\n")
    assert 0 <= said.index("recomputing the start (pretraining 8 steps)") < said.index(
        f"replaying {len(ops) - 1} operations")


def test_update_digests_are_xxh3_and_an_older_stores_sha256_still_replays(tmp_path):
    import sqlite3

    import fedlm.replay as replay_mod
    from fedlm.params import XXH3, params_hash, update_digest

    db = tmp_path / "r.db"
    _, _, run_id = run_engine(tiny_config("updates=3"), db)
    conn = sqlite3.connect(db)
    digests = [d for (d,) in conn.execute("SELECT update_hash FROM updates")]
    assert digests and all(d.startswith(XXH3) and len(d) == len(XXH3) + 32 for d in digests)
    first = replay(db, run_id)
    assert first.identical and first.mismatched_updates == 0
    sha = {}  # each logged update's SHA-256, as a store written before the xxh3 digests

    def capture(tensors, logged):
        assert update_digest(tensors) == logged  # the digest is of what replay computed
        sha[logged] = params_hash(tensors)
        return True

    original, replay_mod.same_update = replay_mod.same_update, capture
    try:
        replay(db, run_id)
    finally:
        replay_mod.same_update = original
    for new, old in sha.items():
        conn.execute("UPDATE updates SET update_hash=? WHERE update_hash=?", (old, new))
    conn.commit()
    assert replay(db, run_id).mismatched_updates == 0  # SHA-256 digests are still read
    conn.execute("UPDATE updates SET update_hash='0' || substr(update_hash, 2) WHERE op = "
                 "(SELECT MIN(op) FROM updates)")
    conn.commit()
    assert replay(db, run_id).mismatched_updates == 1  # and still checked
