"""Experiment trackers (fedlm.track): what a run sends is read back with each
tracker's own reader (TensorBoard's event accumulator, MLflow's client on the local
store, the W&B offline run file) and compared with the run store's rows."""

from __future__ import annotations

import glob
import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedlm import store
from fedlm.errors import ConfigError
from fedlm.track import BACKENDS, Follower, check_installed, export
from fedlm.track.record import scalars
from tests._cli import run_cli, no_work_fixture  # noqa: F401  (a fixture)
from tests.conftest import tiny_config
from tests.wandb_records import read_run

TINY = ["model=tiny", "workers=2", "updates=4", "inner.steps=3", "inner.batch_size=4",
        "eval.every=1", "eval.batches=2", "eval.batch_size=8", "data.seq_len=64",
        "name=tracked"]


def _wandb_core_pids() -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"wandb-core" in (proc / "cmdline").read_bytes():
                pids.add(int(proc.name))
        except OSError:
            pass
    return pids


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """One in-process run, followed live by all three trackers, as a user runs it."""
    folder = tmp_path_factory.mktemp("tracked")
    before = _wandb_core_pids()
    cmd = [sys.executable, "-m", "fedlm", "run", "--backend", "inprocess", "--quiet",
           "--db", "t.db", "--track", "tensorboard", "--track", "mlflow", "--track", "wandb"]
    for kv in TINY:
        cmd += ["--set", kv]
    out = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "tracking" not in out.stderr  # no tracker failed
    assert not _wandb_core_pids() - before  # W&B's service ended with the command
    return folder


def _stored(db: Path) -> list[dict[str, float]]:
    points = store.progress_points(db, 1)
    assert len(points) == 5  # versions 0..4
    return [{"step": p.version, **scalars(p)} for p in points]


def _tensorboard(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run_dir,) = glob.glob(str(folder / "tensorboard" / "*"))
    events = EventAccumulator(run_dir)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_tensorboard_event_files_hold_the_runs_metrics(tracked):
    scalars_by_tag = _tensorboard(tracked / "runs" / "track")
    for row in _stored(tracked / "t.db"):
        for tag in ("val/perplexity", "val/bits_per_byte", "fleet/idle_fraction",
                    "fleet/bytes_up", "progress/tokens"):
            assert (row["step"], pytest.approx(row[tag], rel=1e-6)) in \
                [(s, v) for s, v in scalars_by_tag[tag]], tag
    final = _stored(tracked / "t.db")[-1]
    assert scalars_by_tag["by_tokens/perplexity"][-1] == (
        final["progress/tokens"], pytest.approx(final["val/perplexity"], rel=1e-6))


def test_mlflow_local_store_holds_the_run_its_config_and_metrics(tracked):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tracked / 'runs' / 'track' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("fedlm").experiment_id])
    assert run.info.run_name == "run1 tracked" and run.info.status == "FINISHED"
    assert run.data.params["inner.steps"] == "3" and run.data.params["model"] == "tiny"
    assert "track.backends" not in run.data.params  # where it is tracked is not the run
    assert run.data.tags["fedlm.run_id"] == "1"
    history = client.get_metric_history(run.info.run_id, "val/perplexity")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == \
        [(r["step"], r["val/perplexity"]) for r in _stored(tracked / "t.db")]
    lost = client.get_metric_history(run.info.run_id, "fleet/lost_jobs")
    assert [m.value for m in lost] == [0.0] * 5


def test_wandb_offline_run_file_holds_the_run_its_config_and_history(tracked):
    (path,) = glob.glob(str(tracked / "runs" / "track" / "wandb" / "offline-run-*" /
                            "run-*.wandb"))
    run = read_run(path)
    assert run["name"] == "run1 tracked" and run["exit_code"] == 0
    assert run["config"]["inner.steps"] == 3 and run["config"]["model"] == "tiny"
    for row in _stored(tracked / "t.db"):
        logged = run["history"][row["step"]]
        for key in ("val/perplexity", "fleet/mean_staleness", "fleet/bytes_down",
                    "progress/virtual_time"):
            assert logged[key] == pytest.approx(row[key], rel=1e-12), key


def test_export_sends_what_following_the_run_live_sent(tracked, tmp_path):
    db = tracked / "t.db"
    sent = export(db, 1, ["tensorboard"], str(tmp_path))
    assert sent.points == 5
    assert _tensorboard(tmp_path) == _tensorboard(tracked / "runs" / "track")
    # and through the command line, into a folder of its own
    rc, out, err = run_cli(["export", "1", "--db", str(db), "--track", "tensorboard",
                            "--track-dir", str(tmp_path / "cli")])
    assert rc == 0, err
    assert "5 progress points to tensorboard" in out
    assert _tensorboard(tmp_path / "cli") == _tensorboard(tmp_path)


class _Recording:
    name = "recording"

    def __init__(self, fail_at: int | None = None) -> None:
        self.points, self.fail_at, self.status = [], fail_at, None

    def start(self, run) -> None:
        self.run = run

    def log(self, point) -> None:
        if self.fail_at is not None and len(self.points) == self.fail_at:
            raise OSError("disk quota exceeded")
        self.points.append(point)

    def finish(self, status: str) -> None:
        self.status = status


def test_a_tracker_failing_mid_run_is_dropped_and_the_run_goes_on(tmp_path, capsys):
    from fedlm import runner

    cfg = tiny_config("workers=2", "updates=4", "eval.every=1")
    db = tmp_path / "r.db"
    good, bad = _Recording(), _Recording(fail_at=2)
    follower = Follower(db, cfg, [bad, good], every=0.0)
    runner.run_inprocess(cfg, db, on_start=follower.begin,
                         progress=lambda p: follower.poll())
    assert len(good.points) >= 3  # handed on while the run went (one evaluation behind)
    follower.end()
    assert store.run_row(db, 1)["status"] == "finished"
    assert [p.version for p in good.points] == [0, 1, 2, 3, 4] and good.status == "finished"
    assert len(bad.points) == 2 and bad.status is None  # dropped at its failure
    err = capsys.readouterr().err
    assert err.count("fedlm: tracking: recording failed to log (OSError: disk quota "
                     "exceeded); the run goes on without it") == 1


class _Silent(_Recording):
    """A tracker whose server never answers its start (nobody listens at its URI)."""

    name = "silent"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def start(self, run) -> None:
        self.release.wait(60)  # bounded: the test releases it


def test_a_tracker_that_does_not_answer_is_dropped_in_time(tmp_path, capsys, monkeypatch):
    from fedlm import runner

    cfg = tiny_config("workers=2", "updates=2", "eval.every=1")
    db = tmp_path / "r.db"
    silent, good = _Silent(), _Recording()
    monkeypatch.setattr(Follower, "timeout", 0.5)
    follower = Follower(db, cfg, [silent, good], every=0.0)
    t0 = time.monotonic()
    try:
        runner.run_inprocess(cfg, db, on_start=follower.begin,
                             progress=lambda p: follower.poll())
        follower.end()
    finally:
        silent.release.set()
    assert time.monotonic() - t0 < 30  # the run did not wait for the silent tracker
    assert [t.name for t in follower.trackers] == ["recording"] and good.status == "finished"
    err = capsys.readouterr().err
    assert "\nfedlm: tracking: silent failed to start (TimeoutError: no answer within 0.5 s)" \
        in err


def _cli_run(tmp_path, uri: str, *sets: str) -> list[str]:
    """``fedlm run`` of a tiny model tracked to MLflow at ``uri``, as a user types it."""
    cmd = [sys.executable, "-m", "fedlm", "run", "--backend", "inprocess", "--track", "mlflow",
           "--db", str(tmp_path / "r.db"), "--set", f"track.mlflow_uri={uri}",
           "--set", f"track.dir={tmp_path / 'track'}"]
    for kv in ("model=tiny", "workers=2", "inner.steps=3", "inner.batch_size=4",
               "eval.batches=2", "eval.batch_size=8", "data.seq_len=64", *sets):
        cmd += ["--set", kv]
    return cmd


def test_an_mlflow_server_nobody_listens_on_costs_one_line_and_no_wait(tmp_path):
    # As a user runs it, in a process of its own: under pytest the root logger has
    # pytest's handlers, so library warnings would never reach stderr here.
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    done = subprocess.run(_cli_run(tmp_path, f"http://127.0.0.1:{port}", "updates=1"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 < 60 and store.run_row(tmp_path / "r.db", 1)["status"] \
        == "finished"
    err = done.stderr  # what the terminal shows: library logging included
    assert err.count("fedlm: tracking: mlflow failed to start") == 1, err
    assert "Traceback" not in err and "Retry" not in err, err


class _MlflowThatDies(http.server.BaseHTTPRequestHandler):
    """Enough of MLflow's REST API to start a run; every metric batch after the first
    gets its connection dropped, as a server that went down mid-run."""

    batches = 0

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # experiments/get-by-name
        self._answer({"experiment": {"experiment_id": "1", "name": "fedlm",
                                     "lifecycle_stage": "active", "artifact_location": ""}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if self.path.endswith("runs/create"):
            return self._answer({"run": {"info": {
                "run_id": "r1", "run_uuid": "r1", "experiment_id": "1", "status": "RUNNING",
                "start_time": 0, "lifecycle_stage": "active", "artifact_uri": ""}, "data": {}}})
        if "metrics" in body:
            type(self).batches += 1
            if type(self).batches > 1:
                self.close_connection = True  # no answer: the connection drops
                return
        self._answer({})

    def log_message(self, *args):
        pass


def test_an_mlflow_server_that_dies_mid_run_costs_one_line(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MlflowThatDies)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = subprocess.run(_cli_run(tmp_path, f"http://127.0.0.1:{server.server_port}",
                                       "updates=4", "eval.every=1"),
                              cwd=tmp_path, capture_output=True, text=True, timeout=180)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    assert _MlflowThatDies.batches >= 2  # it started, logged, then went down
    err = done.stderr
    assert err.count("\nfedlm: tracking: mlflow failed to log (") == 1, err
    assert "Traceback" not in err and "Retry" not in err, err


def test_a_tracker_that_cannot_open_is_left_out_and_the_run_goes_on(tmp_path, capsys):
    from fedlm import runner

    cfg = tiny_config("workers=2", "updates=2", "eval.every=1", "track.mlflow_uri=bogus://x",
                      f"track.dir={tmp_path / 'track'}",
                      'track.backends=["mlflow", "tensorboard"]')
    db = tmp_path / "r.db"
    follower = Follower.of(db, cfg)
    assert [t.name for t in follower.trackers] == ["tensorboard"]
    assert "fedlm: tracking: mlflow failed to open (" in capsys.readouterr().err
    runner.run_inprocess(cfg, db, on_start=follower.begin, progress=lambda p: follower.poll())
    follower.end()
    assert [s for s, _ in _tensorboard(tmp_path / "track")["val/perplexity"]] == [0, 1, 2]


def test_a_tracker_not_installed_is_refused_in_one_line(no_work, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"track: wandb not installed .*pip install "
                                          r"'fedlm\[track\]'"):
        check_installed(["tensorboard", "wandb"])
    rc, out, err = run_cli(["run", "--track", "wandb", "--set", "model=tiny"])
    assert rc == 2 and err.count("\n") == 1 and "pip install 'fedlm[track]'" in err, err


def test_a_sweep_with_a_tracker_not_installed_is_refused_before_its_store_is_written(
        no_work, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    (no_work / "s.toml").write_text('db = "s.db"\nout = "s.md"\nprofiles = ["very"]\n'
                                    'base = ["model=tiny"]\n[[arm]]\nlabel = "sync"\n'
                                    'reference = true\nset = ["strategy=diloco"]\n')
    rc, out, err = run_cli(["sweep", "s.toml", "--track", "wandb"])
    assert rc == 2 and err.count("\n") == 1 and "track: wandb not installed" in err, err
    assert sorted(p.name for p in no_work.iterdir()) == ["s.toml"]  # no store, no claims


def test_track_settings_are_checked(no_work):
    rc, _, err = run_cli(["run", "--set", 'track.backends=["neptune"]'])
    assert rc == 2 and "track.backends[0]: must be tensorboard, mlflow or wandb" in err
    rc, _, err = run_cli(["run", "--track", "neptune"])
    assert rc == 2 and "invalid choice" in err
    assert set(BACKENDS) == {"tensorboard", "mlflow", "wandb"}


def test_a_sweep_tracks_each_run_grouped_by_arm_and_profile(monkeypatch, tmp_path):
    from fedlm.sweep import children, run as sweep, spec as sweep_spec

    spec_path = tmp_path / "s.toml"
    spec_path.write_text(f'db = "{tmp_path / "s.db"}"\nout = "{tmp_path / "s.md"}"\n'
                         'base = ["model=tiny"]\nprofiles = ["very"]\nseeds = [0, 1]\n'
                         '[[arm]]\nlabel = "DN + DyLU"\nreference = true\n'
                         'set = ["strategy=delayed-nesterov"]\n')
    spec = sweep_spec.load_spec(spec_path, quick=False)
    commands = []
    monkeypatch.setattr(children.Children, "run",
                        lambda self, cmd: commands.append(cmd) or (1, "", "stand-in"))
    sweep.run_sweep(spec, backend="inprocess", track=["tensorboard"], log=lambda *a: None)
    assert len(commands) == 2
    for cmd in commands:
        assert cmd[cmd.index("--track") + 1] == "tensorboard"
        groups = [kv for kv in cmd if kv.startswith("track.group=")]
        assert groups == ['track.group="DN + DyLU @ very"']
