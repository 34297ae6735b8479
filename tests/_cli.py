"""Shared by the bad-input tests: run ``fedlm`` in-process, and make sure nothing
heavy (training, deployment, sweeps, replays, the dashboard server) can start."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

from fedlm import cli


class StartedWork(BaseException):
    """Raised by the stand-ins below: the command accepted its input and went on."""


def _started(*args, **kwargs):
    raise StartedWork


@pytest.fixture(name="no_work")
def no_work_fixture(monkeypatch, tmp_path):
    """Nothing may train, deploy, sweep, replay or serve: those steps raise StartedWork.
    The working directory is empty, so default paths (runs/fedlm.db) do not exist."""
    import subprocess as subprocess_module

    from fedlm.deploy import run_local as deploy
    from fedlm import interrupts, replay
    from fedlm.flower import simulation
    from fedlm.sweep import run as sweep

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(simulation, "quiet_libraries", _started)  # run and replay: first step
    monkeypatch.setattr(deploy, "main_local", _started)
    monkeypatch.setattr(sweep, "run_sweep", _started)
    monkeypatch.setattr(replay, "replay", _started)
    monkeypatch.setattr(subprocess_module, "call", _started)
    monkeypatch.setattr(interrupts, "serve", _started)  # the dashboard's server
    return tmp_path


def run_cli(argv: list[str]) -> tuple[int | str, str, str]:
    """(exit status or "started", stdout, stderr) of ``fedlm ARGV`` in this process."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as exc:
            rc = exc.code
        except StartedWork:
            rc = "started"
    return rc, out.getvalue(), err.getvalue()


def assert_refused(rc, out, err, fragment: str = "") -> None:
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), repr(err)
    assert lines[0].startswith("fedlm"), lines[0]
    assert ": error: " in lines[0], lines[0]
    assert fragment in lines[0], (fragment, lines[0])
