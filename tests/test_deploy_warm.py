"""The warm ClientApp executor (fedlm.deploy.warm_executor) in a real deployment: TLS and
SuperNode authentication on, the SuperNodes in ``--isolation process``.

One deployment for the module (two SuperNodes), started once:

* one run, async SGD with injected crashes on worker 1: every task of a node ran
  in one executor process (the pid it logs per task), a ClientApp exception came
  back as Flower's error reply (the engine logs the job failed with a flower
  error) and the executor went on with the next task; the run replays to the same
  weights;
* a SuperNode whose public key was not registered cannot join;
* stop() leaves nothing running (checked when the module is done with it).
"""

import re
import sqlite3
import subprocess
import sys
import time

import pytest

from fedlm import config_load
from fedlm.deploy.local import LocalDeployment
from fedlm.deploy.warm_executor import START_MARK
from tests.test_deploy import _processes_mentioning

pytestmark = pytest.mark.flower

SETS = ["model=tiny", "workers=2", "updates=8", "inner.steps=2", "inner.batch_size=4",
        "eval.every=1000", "eval.batches=1", "data.seq_len=64", "strategy=async-sgd",
        "clock=wall", "seed=0", "faults.crash=0.5", "faults.workers=[1]"]


def _tasks(log: str) -> list[tuple[int, int]]:
    """(task number in its process, pid) of each task the warm executor started."""
    return [(int(n), int(pid)) for n, pid in
            re.findall(re.escape(START_MARK) + r" \d+ \(#(\d+) in pid (\d+)\)", log)]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    home = tmp_path_factory.mktemp("warm") / "flwr-home"
    with LocalDeployment(home, 2, tls=True, auth=True) as dep:
        assert dep.warm_exec
        dep.start(config_load.load(None, SETS))
        yield dep
    assert _processes_mentioning(str(home)) == []  # SuperNodes, executors: gone


def test_warm_executor_reuses_its_process_and_reports_clientapp_errors(deployment, tmp_path):
    dep, home, db = deployment, deployment.home, tmp_path / "runs.db"
    assert dep.run(SETS, str(db), timeout=420) == 0, \
        (home / "supernode1.log").read_text(errors="replace")[-3000:]
    assert dep.security_problems() == []
    logs = {n: (home / f"{n}.log").read_text(errors="replace")
            for n in ("supernode0", "supernode1")}

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert conn.execute("SELECT status, clock FROM runs").fetchone() == ("finished", "wall")
    failed = [d for k, w, d in conn.execute("SELECT kind, worker, detail FROM events")
              if k == "job_failed" and w == 1]
    done_after = conn.execute(
        "SELECT count(*) FROM updates WHERE worker = 1").fetchone()[0]
    conn.close()
    assert failed and all("flower error" in d for d in failed), failed
    assert "InjectedFault" in logs["supernode1"] or "injected" in logs["supernode1"]

    for name, log in logs.items():
        assert "Start `flwr-clientapp` process" not in log, name  # no process per message
        tasks = _tasks(log)
        # the partition query and at least two train jobs, all in one process,
        # numbered 1, 2, 3, ... there (a ClientApp error did not end it)
        assert len(tasks) >= 3, (name, log[-2000:])
        assert len({pid for _, pid in tasks}) == 1, (name, tasks)
        assert [n for n, _ in tasks] == list(range(1, len(tasks) + 1)), (name, tasks)
    assert done_after >= 1  # worker 1 trained again after its crashes

    replay = subprocess.run([sys.executable, "-m", "fedlm", "replay", "1", "--db", str(db)],
                            capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0 and "identical" in replay.stdout, replay.stdout + replay.stderr


def _online(dep: LocalDeployment) -> list[str]:
    return [n["node-id"] for n in dep.list_supernodes() if n.get("status") == "online"]


def test_unregistered_supernode_is_refused(deployment):
    """A SuperNode whose public key was not registered cannot join."""
    dep = deployment
    deadline = time.monotonic() + 60
    while len(online := _online(dep)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(online) == 2, dep.list_supernodes()
    rogue = dep.start_supernode("rogue", "partition-id=0 num-partitions=2", register=False)
    try:
        rc = rogue.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the unregistered SuperNode is still running after 90 s:\n"
                    + (dep.home / "rogue.log").read_text(errors="replace")[-2000:])
    assert rc != 0
    assert "Failed to activate SuperNode" in (dep.home / "rogue.log").read_text(errors="replace")
    assert "No SuperNode found with the given public key" in dep.superlink_log()
    assert [n["node-id"] for n in dep.list_supernodes()] == online  # never listed


def test_a_stranger_registered_through_the_control_api_gets_no_work(deployment, tmp_path,
                                                                    capfd):
    """A SuperNode registered through the Control API but not by this deployment (here
    with the owner's own credentials: a stranger cannot register at all, see
    tests/test_deploy_owner.py) is admitted by the SuperLink; fedlm's runs use only the
    nodes the deployment registered, and say so."""
    dep = deployment
    before = set(_online(dep))
    stranger = dep.start_supernode("stranger", "partition-id=0 num-partitions=2", ours=False)
    deadline = time.monotonic() + 60
    while len(set(_online(dep)) - before) < 1 and time.monotonic() < deadline:
        assert stranger.poll() is None, (dep.home / "stranger.log").read_text()[-2000:]
        time.sleep(0.5)
    (stranger_id,) = set(_online(dep)) - before
    db = tmp_path / "runs.db"
    sets = [s for s in SETS if not s.startswith("faults.")] + ["updates=4"]
    assert dep.run(sets, str(db), timeout=420) == 0
    out = capfd.readouterr()
    assert f"ignoring SuperNode {stranger_id}: not one of this deployment's" in out.out + out.err
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        used = {n for (n,) in conn.execute("SELECT node_id FROM workers")}
        assert conn.execute("SELECT status FROM runs").fetchone() == ("finished",)
    used = {str(n) for n in used}  # stored as text (64-bit ids)
    assert str(stranger_id) not in used and used == {str(n) for n in dep.node_ids}
