"""No swallowed failure: a run that fails is marked failed with its reason, the
command says it in one line and exits non-zero, and a sweep reports every failed
cell and goes on (or stops at the first with --fail-fast)."""

import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from fedlm import checkpoint, data, store
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parent.parent
TINY = ["model=tiny", "workers=2", "updates=3", "inner.steps=2", "inner.batch_size=2",
        "eval.every=3", "eval.batches=1", "eval.batch_size=4", "data.seq_len=64"]
BROKEN = '''
from fedlm.strategies.diloco import DiLoCo


class Broken(DiLoCo):
    """DiLoCo whose second round fails."""

    def on_update(self, update, params):
        if update.base_version >= 1:
            raise ValueError("outer step exploded")
        return super().on_update(update, params)


class Unsaveable(DiLoCo):
    """DiLoCo whose state holds an object of its own: no checkpoint can carry it."""

    def state_dict(self):
        return {**super().state_dict(), "clock": Unsaveable}


class Exits(DiLoCo):
    """DiLoCo whose first update ends the process, the status it asks for being 0."""

    def on_update(self, update, params):
        import sys
        sys.exit(0)
'''


def _env(tmp_path) -> dict:
    (tmp_path / "broken_strategy.py").write_text(BROKEN)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}


def _run(db, *sets, env=None, **kwargs) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "fedlm", "run", "--backend", "inprocess", "--db", str(db)]
    for kv in [*TINY, *sets]:
        cmd += ["--set", kv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
                          **kwargs)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def test_a_failing_strategy_marks_the_run_failed_and_says_why(tmp_path):
    db = tmp_path / "f.db"
    out = _run(db, "strategy=broken_strategy:Broken", env=_env(tmp_path))
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert _error_lines(out.stderr) == [
        "fedlm: error: run 1 failed: ValueError: outer step exploded"]
    (run,) = store.list_runs(db)
    assert (run["status"], run["error"]) == ("failed", "ValueError: outer step exploded")


def test_a_plugin_that_calls_sys_exit_fails_the_run_it_does_not_end_the_command(tmp_path):
    """A plug-in's SystemExit(0) once ended `fedlm run` with status 0, the run stored as
    failed: the exit belongs to the run, which failed."""
    db = tmp_path / "x.db"
    out = _run(db, "strategy=broken_strategy:Exits", env=_env(tmp_path))
    assert out.returncode == 1, out.stderr
    assert _error_lines(out.stderr) == ["fedlm: error: run 1 failed: PluginExit: "
                                        "SystemExit(0) raised inside the run (a plug-in "
                                        "called sys.exit)"]
    assert store.list_runs(db)[0]["status"] == "failed"


def test_a_strategy_state_no_checkpoint_can_carry_fails_at_its_first_checkpoint(tmp_path):
    """Such checkpoints were written without a word, then skipped by --resume, which
    started the run over from version 0."""
    db = tmp_path / "u.db"
    out = _run(db, "strategy=broken_strategy:Unsaveable", "reliability.checkpoint_every=1",
               env=_env(tmp_path))
    assert out.returncode == 1, out.stderr
    (line,) = _error_lines(out.stderr)
    assert line.startswith("fedlm: error: run 1 failed: UnsafeState: checkpoint['engine']")
    assert "['strategy']['clock'] is an object of abc.ABCMeta, which a checkpoint cannot carry" in line
    assert not list((tmp_path / "checkpoints").glob("**/ckpt-v*.pt"))


def test_a_checkpoint_the_disk_cannot_take_fails_the_run_and_leaves_no_temp_file(tmp_path):
    """The file-size limit makes the kernel refuse the checkpoint's write (EFBIG), as a
    full disk would (ENOSPC) half-way through it: same code path, a real failed write."""
    cfg = tiny_config(*TINY, "model=small")
    data.load_corpus(cfg.data)  # the token cache is written here, not under the limit
    limit = 4 << 20  # the store fits; a checkpoint of the small model (~15 MB) does not

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a dead process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    db = tmp_path / "full.db"
    out = _run(db, "model=small", "reliability.checkpoint_every=1",
               "inner.state_store=context", preexec_fn=limited)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    (line,) = _error_lines(out.stderr)
    assert line.startswith("fedlm: error: run 1 failed: OSError: [Errno 27] ")
    assert "ckpt-v000000001.pt: cannot write the checkpoint (File too large)" in line
    (run,) = store.list_runs(db)
    assert run["status"] == "failed" and "File too large" in run["error"]
    folder = checkpoint.folder_for(db, 1)
    assert list(folder.iterdir()) == [], list(folder.iterdir())  # the half-written file is gone


SPEC = '''
db = "{db}"
out = "{out}"
base = {base}
profiles = ["homogeneous", "very"]

[[arm]]
label = "sync"
set = ["strategy=diloco"]
reference = true

[[arm]]
label = "broken"
set = ["strategy=broken_strategy:Broken"]

[[arm]]
label = "async"
set = ["strategy=async-sgd"]
'''


def _sweep(tmp_path, *flags, **kwargs):
    db, out = tmp_path / "s.db", tmp_path / "report.md"
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(db=db, out=out, base=repr(TINY).replace("'", '"')))
    cmd = [sys.executable, "-m", "fedlm", "sweep", str(spec), "--backend", "inprocess", *flags]
    return db, out, cmd


def test_a_sweep_reports_every_failed_cell_and_goes_on(tmp_path):
    db, out, cmd = _sweep(tmp_path, "--jobs", "2")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=_env(tmp_path))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = _error_lines(proc.stderr)
    assert sorted(errors) == [
        f"fedlm: error: sweep cell broken @ {p} failed: run {{}} failed: ValueError: outer "
        f"step exploded".format(r) for p, r in sorted(_failed_ids(db).items())]
    assert "fedlm: 4 of 6 cells finished, 2 failed" in proc.stderr
    statuses = sorted(r["status"] for r in store.list_runs(db))
    assert statuses == ["failed"] * 2 + ["finished"] * 4
    text = out.read_text()
    assert "| broken | failed | failed |" in text
    assert "- **broken @ very**: run" in text and "ValueError: outer step exploded" in text


def _failed_ids(db) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return {name.split(" @ ")[1]: rid for rid, name in
                conn.execute("SELECT id, name FROM runs WHERE status='failed'")}


def test_fail_fast_stops_the_sweep_at_the_first_failure(tmp_path):
    db, out, cmd = _sweep(tmp_path, "--fail-fast")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=_env(tmp_path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "stopped at the first failure" in proc.stderr
    # in order: sync @ homogeneous finished, broken @ homogeneous failed, nothing after
    assert [(r["name"], r["status"]) for r in store.list_runs(db)] == [
        ("sync @ homogeneous", "finished"), ("broken @ homogeneous", "failed")]


def test_sigterm_stops_a_sweep_and_the_runs_it_started(tmp_path):
    db, out, cmd = _sweep(tmp_path, "--jobs", "2")
    # long runs, so they are still training when the sweep is stopped
    spec = Path(cmd[4])
    spec.write_text(spec.read_text().replace('"updates=3"', '"updates=100000"'))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=_env(tmp_path), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (db.exists() and len(_running(db)) == 2):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "two runs did not start in 120 s"
            time.sleep(0.1)  # polling the sweep's database, a bounded wait
        children = _running(db)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    for pid in children.values():  # every run it started is gone, and marked so
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
    assert sorted(r["status"] for r in store.list_runs(db)) == ["interrupted"] * 2


def _running(db) -> dict[int, int]:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return dict(conn.execute("SELECT id, owner_pid FROM runs WHERE status='running'"))
    except sqlite3.OperationalError:  # the schema is being made
        return {}


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


DIVERGING_SPEC = '''
db = "{db}"
out = "{out}"
base = {base}
profiles = ["homogeneous"]

[[arm]]
label = "sync"
set = ["strategy=diloco"]
reference = true

[[arm]]
label = "too-fast"
set = ["strategy=diloco", "outer.lr=3000", "eval.every=1"]
'''


def test_a_sweep_shows_a_diverged_cell_as_diverged_with_its_reason(tmp_path):
    from fedlm.cli.runs import EXIT_STATUS
    from fedlm.sweep.run import DIVERGED_EXIT

    assert DIVERGED_EXIT == EXIT_STATUS["diverged"]  # how the sweep tells it from a failure
    db, out, spec = tmp_path / "s.db", tmp_path / "report.md", tmp_path / "spec.toml"
    spec.write_text(DIVERGING_SPEC.format(db=db, out=out, base=repr(TINY).replace("'", '"')))
    proc = subprocess.run([sys.executable, "-m", "fedlm", "sweep", str(spec), "--backend",
                           "inprocess"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    runs = {r["name"]: r for r in store.list_runs(db)}
    diverged = runs["too-fast @ homogeneous"]
    assert diverged["status"] == "diverged" and "its best" in diverged["error"]
    reason = f"run {diverged['id']} diverged: {diverged['error']}"
    assert _error_lines(proc.stderr) == [
        f"fedlm: error: sweep cell too-fast @ homogeneous diverged: {reason}"]
    assert "fedlm: 1 of 2 cells finished, 0 failed, 1 diverged" in proc.stderr
    text = out.read_text()
    assert "| too-fast | diverged |" in text
    assert f"- **too-fast @ homogeneous**: {reason}" in text
