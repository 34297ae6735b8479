"""``fedlm deploy local``: the run on Flower's deployment engine (a SuperLink and
SuperNodes on this machine, ``fedlm.deploy.local``), then its summary. SIGTERM and SIGHUP
stop it as Ctrl-C does, so that every process it started is stopped too. With ``--track``
the run goes to the experiment trackers when it is over (``fedlm.track.export``: the
ServerApp runs in Flower's SuperExec, not in this process)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fedlm import interrupts
from fedlm.cli.runs import print_summary
from fedlm.store import check_writable


def cmd_deploy(args: argparse.Namespace) -> int:
    from fedlm import config_load
    from fedlm.deploy import home as deploy_home
    from fedlm.deploy import local as deploy
    from fedlm.deploy import run_local

    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"workers={args.workers}")
    cfg = config_load.load(args.config, overrides)
    run_local.check_config(cfg)  # what a deployment would not apply: refused, not ignored
    from fedlm.sim import codecs
    from fedlm.worker import optimizers

    optimizers.probe(cfg)  # plug-in code that fails on the model: now, not mid-run
    codecs.probe(cfg)
    db = args.db or cfg.db
    from fedlm.track import check_installed, with_trackers

    cfg = with_trackers(cfg, args.track)
    check_installed(cfg.track.backends)  # refused now, not after the run,
    # not resolved: a --home that is a link is refused, not followed (fedlm.deploy.home)
    home = Path(os.path.abspath(args.home))
    deploy_home.check(home)  # a folder that is not fedlm's: refused before anything is written
    check_writable(db)  # and before anything is written at --db
    with interrupts.interrupt_on_signals():  # LocalDeployment.stop runs on the way out
        try:
            status, run_id = run_local.main_local(cfg, overrides, db, home, args.config)
        except KeyboardInterrupt:  # its processes are stopped: the run was interrupted
            _mark_interrupted(db, home / deploy.RUN_ID_FILE)
            raise
    if status != 0:
        print(f"fedlm: error: flwr run exited with {status}; logs in {args.home}",
              file=sys.stderr)
        return 1
    if run_id is None:
        print(f"fedlm: error: the ServerApp reported no run; logs in {args.home}",
              file=sys.stderr)
        return 1
    if cfg.track.backends:  # the ServerApp ran in Flower's SuperExec: sent once it is over
        from fedlm.track import export

        print(export(db, run_id, cfg.track.backends, cfg.track.dir))
    return print_summary(db, run_id)  # its own run: not the store's newest, which may be another's


def _mark_interrupted(db: str, run_id_file: Path) -> None:
    """The deployed run, stopped by Ctrl-C or SIGTERM, as ``interrupted`` (its ServerApp,
    stopped with the SuperLink, may have stored it as failed, or not at all)."""
    from fedlm.store import mark_ended, run_row

    try:
        run_id = int(run_id_file.read_text())
        row = run_row(db, run_id)
    except (OSError, ValueError):
        return  # the ServerApp had not stored a run yet
    if row is not None and row["status"] in ("running", "failed"):
        mark_ended(db, run_id, status="interrupted", virtual_time=row["virtual_time"] or 0.0,
                   updates=row["updates"] or 0, error="interrupted (deployment stopped)")
