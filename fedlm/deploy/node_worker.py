"""A node's long-lived worker process (see ``fedlm.deploy.node_client``).

    python -m fedlm.deploy.node_worker --socket PATH --watch-pid PID [--idle SECONDS]

Serves one request at a time on the Unix socket PATH: a query or a train
message's contents, answered with the reply's contents, through the same code
the in-process ClientApp runs (``fedlm.flower.client_app.query_answer`` /
``train_answer``). The node's state RecordDict lives here, in place of Flower's
``context.state``, for the process's whole life: the worker's optimizer states
keep their semantics (by job id, ``prev_job``, ``keep_from``). Exits when
process PID (its SuperNode) is gone, or after SECONDS without a request.
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import time
import traceback
from pathlib import Path

from flwr.app import RecordDict

from fedlm.flower import client_app
from fedlm.ownership import pid_alive
from fedlm.deploy.node_client import decode, encode, recv_obj, send_obj

WATCH_SECONDS = 0.5


def answer(request: dict, state: RecordDict) -> dict:
    try:
        content = decode(request["content"])
        node_config = request["node_config"]
        if request["kind"] == "query":
            out = client_app.query_answer(content, node_config)
        else:
            out = client_app.train_answer(content, node_config, state)
        return {"content": encode(out), "pid": os.getpid()}
    except Exception as exc:  # the ClientApp raises it: Flower's error reply
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}", "pid": os.getpid()}


def serve(path: Path, watch_pid: int, idle: float) -> None:
    state = RecordDict()  # this node's state, as context.state was
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink(missing_ok=True)
    server.bind(str(path))
    os.chmod(path, 0o600)
    inode = path.stat().st_ino
    server.listen(8)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    last = time.monotonic()
    try:
        # pid_alive: None (cannot tell) counts as alive; a zombie SuperNode as gone
        while pid_alive(watch_pid, None) is not False and time.monotonic() - last < idle:
            if not sel.select(timeout=WATCH_SECONDS):
                continue
            conn, _ = server.accept()
            with conn:
                try:
                    request = recv_obj(conn)
                except (OSError, EOFError):
                    continue
                reply = answer(request, state)
                try:
                    send_obj(conn, reply)
                except OSError:  # the ClientApp is gone (Flower ended it): nothing to do
                    pass
            last = time.monotonic()
    finally:
        server.close()
        try:
            if path.stat().st_ino == inode:  # not a successor's socket
                path.unlink(missing_ok=True)
                path.with_suffix(".lock").unlink(missing_ok=True)
                log = path.with_suffix(".log")
                if log.stat().st_size == 0:  # keep a log that says something
                    log.unlink()
        except OSError:
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--watch-pid", type=int, required=True)
    ap.add_argument("--idle", type=float, default=1800.0)
    args = ap.parse_args()
    serve(Path(args.socket), args.watch_pid, args.idle)


if __name__ == "__main__":
    main()
