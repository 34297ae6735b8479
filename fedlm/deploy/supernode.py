"""``flower-supernode`` with shorter waits: ``python -m fedlm.deploy.supernode ARGS``.

Flower's SuperNode loop (1.41, 1.42) (``flwr/supernode/start_client_internal.py``) has
two hard-coded waits and no setting for them: ``time.sleep(3)`` after a poll
of the SuperLink that found no message (a job waits 1.5 s on average before
its node even sees it), and ``time.sleep(0.5)`` while it waits for the
ClientApp's reply or a reply object to be stored. This entry point runs the
same SuperNode with those waits capped (``fedlm.flower.patches.supernode_waits``:
0.25 s after an empty poll, ``FEDLM_PATCH_SUPERNODE_WAITS_S``; 4 light requests
a second to the SuperLink per idle node; 0.05 s for the local checks) and
Flower's object pulls retried sooner (``patches.pull_backoff``), both applied
by ``main`` before the SuperNode starts. Nothing else changes: arguments, TLS,
authentication and logs are Flower's. ``fedlm deploy local`` uses it unless
told not to (``LocalDeployment(node_poll=False)``); see docs/deployment.md for
the upstream issue and the switches.

``--warm-executor`` (fedlm's own flag, taken out before Flower parses the
arguments): the SuperNode runs with ``--isolation process`` and this process
starts ``fedlm.deploy.warm_executor`` next to it, as Flower's SuperNode starts
``flower-superexec`` in subprocess mode: same process group, ``--parent-pid``,
the Runtime API address from ``--host``/``--port``, TLS from ``--ssl-*`` and the
SuperExec auth secret of ``--superexec-auth-secret-file``. A warm executor that
dies is started again (after ``RESTART_DELAY_S``) while the SuperNode lives.
"""


from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

from fedlm.flower import patches

WARM_FLAG = "--warm-executor"
RESTART_DELAY_S = 1.0


def warm_executor_command(argv: list[str]) -> list[str]:
    """``fedlm.deploy.warm_executor``'s command line for a SuperNode started with ``argv``."""
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT, UVICORN_DEFAULT_HOST

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--host", default=UVICORN_DEFAULT_HOST)
    ap.add_argument("--port", default=str(SUPERNODE_UVICORN_DEFAULT_PORT))
    ap.add_argument("--ssl-certfile")
    ap.add_argument("--ssl-ca-certfile")
    ap.add_argument("--superexec-auth-secret-file")
    args, _ = ap.parse_known_args(argv)
    host = f"[{args.host}]" if ":" in args.host else args.host
    cmd = [sys.executable, "-m", "fedlm.deploy.warm_executor",
           "--runtime-api-address", f"{host}:{args.port}", "--parent-pid", str(os.getpid())]
    cmd += (["--root-certificates", args.ssl_ca_certfile] if args.ssl_certfile
            else ["--insecure"])
    if args.superexec_auth_secret_file:
        cmd += ["--superexec-auth-secret-file", args.superexec_auth_secret_file]
    return cmd


def _supervise(cmd: list[str]) -> None:
    """Run the warm executor; start it again if it exits while this SuperNode lives."""
    while True:
        code = subprocess.Popen(cmd).wait()
        print(f"fedlm.deploy.supernode: the warm executor exited with {code}; starting it again",
              file=sys.stderr, flush=True)
        time.sleep(RESTART_DELAY_S)


def main() -> None:
    from flwr.supernode.cli import flower_supernode

    # the SuperNode's idle poll and local waits, and the objects of a message it
    # pulls from the SuperLink retried after 20 ms, not 1 s (this process only)
    for done in (patches.supernode_waits(),
                 patches.pull_backoff("flwr.supernode.start_client_internal")):
        print(done.describe(), file=sys.stderr, flush=True)
    argv = sys.argv[1:]
    if WARM_FLAG in argv:
        patches.check_supported("warm-executor")  # one line naming the switch, not a traceback
        argv = [a for a in argv if a != WARM_FLAG]
        if "--isolation" not in argv:
            argv += ["--isolation", "process"]
        threading.Thread(target=_supervise, args=(warm_executor_command(argv),),
                         name="fedlm-warm-executor", daemon=True).start()
    sys.argv = ["flower-supernode", *argv]
    flower_supernode()


if __name__ == "__main__":
    main()
