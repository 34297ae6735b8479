"""``fedlm dashboard``: serve the live Streamlit dashboard over a run database until
it is stopped (Ctrl-C, SIGTERM, SIGHUP), leaving no server process behind.

What it serves and how it is started are ``fedlm.dashboard.launch``'s; running
and stopping the server, ``fedlm.interrupts.serve``'s."""

from __future__ import annotations

import argparse

from fedlm import interrupts
from fedlm.config import Config
from fedlm.errors import ConfigError


def cmd_dashboard(args: argparse.Namespace) -> int:
    from fedlm.dashboard import launch

    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port: must be in [1, 65535], got {args.port}")
    db = launch.database(args.db or Config().db)
    print(f"fedlm dashboard on http://{args.host}:{args.port} reading {db} (Ctrl-C stops it)",
          flush=True)
    return interrupts.serve(launch.command(db, args.host, args.port))
