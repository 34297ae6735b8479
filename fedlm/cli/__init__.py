"""The ``fedlm`` command line.

    fedlm run [CONFIG.toml] [--set key=value ...] [--db PATH]   train, on Flower's simulation engine
    fedlm run --resume RUN_ID [--db PATH]                       continue a killed run (checkpoints)
    fedlm runs [--db PATH]                                      list stored runs
    fedlm show RUN_ID [--db PATH]                               a run's summary
    fedlm export RUN_ID [--db PATH] [--format csv|parquet]      a run's tables as files
    fedlm config [CONFIG.toml] [--set key=value ...]            print the resolved config
    fedlm replay RUN_ID [--db PATH]                             re-execute a run from its log
    fedlm strategies                                            list strategies and policies
    fedlm dashboard [--db PATH] [--port N]                      the live Streamlit dashboard
    fedlm sweep SPEC.toml [--quick] [--jobs N] [--seeds N]      arms x profiles x seeds, one report
                          [--report-only]                       ... of the runs already finished
                          [--arms TEXT]                         ... of some arms (a long study in parts)
    fedlm deploy local --workers N [CONFIG] [--set ...]         SuperLink + SuperNodes on loopback
    fedlm plan --params 1e9 --workers 8 [--plot DIR]            cost model: sync vs async, no run
    fedlm plan --topology ring|tree --fragments P --scan --walltime   topologies, streaming, sweeps
    fedlm trace device|availability --clients N --seed S --out PATH   FedScale-format traces
    fedlm trace show PATH                                       summarise a trace
    fedlm states [--clean] [--older-than DAYS]                  saved worker states on this machine

Bad input ends with one line, ``fedlm: error: FIELD: ...``, and exit status 2.
``run``, ``show`` and ``deploy`` exit by how the run ended (``runs.EXIT_STATUS``):
0 finished, 1 failed (or crashed, or still running), 3 diverged (its validation loss
blew up; one line says where and what to try), 130 interrupted.

The package only parses and prints: ``parser`` holds the grammar, one module per
group of commands calls the library and prints what it returns, and ``main`` (here)
turns what they raise into that one line and an exit status. Each command imports
what it needs when it runs (the config loader pulls in numpy and the strategies;
runs and replay, torch), so that ``fedlm runs``, ``show`` and usage errors answer at
once.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys

from fedlm.cli.dashboard import cmd_dashboard
from fedlm.cli.deploy import cmd_deploy
from fedlm.cli.parser import build_parser, one_line
from fedlm.cli.plan import cmd_plan
from fedlm.cli.run import cmd_replay, cmd_run
from fedlm.cli.runs import cmd_config, cmd_export, cmd_runs, cmd_show, cmd_strategies
from fedlm.cli.states import cmd_states
from fedlm.cli.sweep import cmd_sweep
from fedlm.cli.trace import cmd_trace
from fedlm.config import Config
from fedlm.errors import ConfigError
from fedlm.store import StoreError

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS = {"run": cmd_run, "dashboard": cmd_dashboard, "sweep": cmd_sweep,
            "deploy": cmd_deploy, "runs": cmd_runs, "show": cmd_show, "export": cmd_export,
            "config": cmd_config, "replay": cmd_replay, "strategies": cmd_strategies,
            "plan": cmd_plan, "trace": cmd_trace, "states": cmd_states}


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:  # what is still buffered fails here, not in the interpreter's exit
            if sys.stdout is not None and not sys.stdout.closed:
                sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_gone()


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        return _refuse(exc)
    except (KeyError, StoreError) as exc:
        return _refuse(exc.args[0] if exc.args else exc)
    except BrokenPipeError:
        return _stdout_gone()
    except (OSError, sqlite3.Error) as exc:  # a path or database the command cannot use
        if os.environ.get("FEDLM_DEBUG"):
            raise
        from fedlm import store

        if isinstance(exc, OSError) and not exc.filename and len(exc.args) == 1:
            return _refuse(exc.args[0])  # e.g. the store's "no run database at PATH"
        if isinstance(exc, sqlite3.Error):
            return _refuse(store.db_error(getattr(args, "db", None) or Config().db, exc))
        return _refuse(f"{exc.filename}: {exc.strerror or exc}")
    except Exception as exc:
        # fedlm.replay (torch) is imported only by the commands that need it, so
        # that `fedlm runs`, `show` and usage errors answer at once
        replay = sys.modules.get("fedlm.replay")
        if replay is not None and isinstance(exc, replay.ReplayError):
            return _refuse(exc.args[0] if exc.args else exc)
        raise
    except KeyboardInterrupt:
        print("fedlm: interrupted", file=sys.stderr)
        return 130


def _refuse(message: object) -> int:
    print(f"fedlm: error: {one_line(message)}", file=sys.stderr)
    return 2


def _stdout_gone() -> int:
    """The reader of our output went away (``fedlm runs | head -1``): stop quietly,
    as other Unix tools do, with SIGPIPE's status. Output still buffered would fail
    again at exit, so stdout now points at /dev/null (and stderr too when it is the
    same pipe: ``fedlm runs 2>&1 | head -1``)."""
    def same_pipe(fd: int) -> bool:
        try:
            a, b = os.fstat(fd), os.fstat(1)
        except OSError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    gone = [1, 2] if same_pipe(2) else [1]
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in gone:
        os.dup2(devnull, fd)
    os.close(devnull)
    return 128 + signal.SIGPIPE
