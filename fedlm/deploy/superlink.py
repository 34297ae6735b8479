"""``flower-superlink`` that only its owner can use: ``python -m fedlm.deploy.superlink ARGS``.

Flower's SuperLink (1.41, 1.42) admits every Control API request (start a run,
register a SuperNode, list, stop...) in its open-source build: account
authentication is its OIDC plugin, which is not in this distribution. Whoever
reaches the port and trusts ``ca.crt`` could ``flwr run`` an app of their own,
whose ServerApp then runs on the SuperLink's host and whose ClientApp runs on
every SuperNode. And in its default (subprocess) isolation the SuperLink hands
the ServerApp task of a run to whoever asks its Runtime API first (``AcquireTask``,
unsigned): a stranger polling it takes the owner's run over.

Two flags of fedlm's own, taken out before Flower parses the arguments:

* ``--owner-token-file FILE``: the SuperLink admits a Control API request only if
  it carries the token in FILE as its bearer token
  (``fedlm.flower.patches.owner_token``); every other one gets Flower's 401. The
  ``flwr`` CLI sends it from the credential store of its ``FLWR_HOME``
  (``fedlm.deploy.credentials.store_cli_token``).
* ``--superexec``: with ``--isolation process --superexec-auth-secret-file S``,
  this process starts Flower's ``flower-superexec`` next to the SuperLink (as
  Flower's subprocess isolation does: same Runtime API address, TLS, parent pid)
  with the same secret, so the SuperLink hands ServerApp tasks only to requests
  signed with S.

Nothing else changes: arguments, TLS, SuperNode authentication and logs are
Flower's. ``fedlm deploy local`` starts its SuperLink this way (``command``)
unless ``FEDLM_PATCH_OWNER_TOKEN=0``; see docs/deployment.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedlm.deploy.credentials import make_secret, make_token
from fedlm.flower import patches

TOKEN_FLAG = "--owner-token-file"
EXEC_FLAG = "--superexec"
# what this process logs once the owner-token patch is in place
OWNER_TOKEN_ON = "fedlm patch owner-token (Control API requests need the owner token)"


def command(home: Path) -> tuple[list[str], str]:
    """The start of the command line of an owner-only SuperLink for the deployment in
    ``home`` (Flower's arguments follow) and its Control API token: a new token in
    ``HOME/keys/control.token`` (the owner's ``flwr`` needs it too:
    ``credentials.store_cli_token``) and a new SuperExec secret in
    ``HOME/keys/superlink.superexec``."""
    token_file = home / "keys" / "control.token"
    token = make_token(token_file)
    secret = make_secret(home / "keys" / "superlink.superexec")
    return [sys.executable, "-m", "fedlm.deploy.superlink", TOKEN_FLAG, str(token_file),
            EXEC_FLAG, "--isolation", "process", "--superexec-auth-secret-file",
            str(secret)], token


def wait_until_listening(port: int, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    """Until something listens on 127.0.0.1:``port`` (the SuperLink ``proc``, once up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}; see {log}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s; see {log}")


def split_token_file(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the path after ``--owner-token-file``, the other arguments)."""
    if TOKEN_FLAG not in argv:
        return None, argv
    k = argv.index(TOKEN_FLAG)
    if k + 1 >= len(argv):
        sys.exit(f"fedlm.deploy.superlink: {TOKEN_FLAG} needs a file")
    return argv[k + 1], argv[:k] + argv[k + 2:]


def superexec_command(argv: list[str]) -> list[str]:
    """Flower's ``flower-superexec`` for the SuperLink started with ``argv``, as Flower's
    subprocess isolation starts it, plus the SuperExec secret."""
    from flwr.supercore.address import resolve_bind_address
    from flwr.supercore.constant import SUPERLINK_UVICORN_DEFAULT_PORT, UVICORN_DEFAULT_HOST

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--host", default=UVICORN_DEFAULT_HOST)
    ap.add_argument("--port", default=str(SUPERLINK_UVICORN_DEFAULT_PORT))
    ap.add_argument("--ssl-certfile")
    ap.add_argument("--ssl-ca-certfile")
    ap.add_argument("--superexec-auth-secret-file")
    ap.add_argument("--disable-runtime-dependency-installation", action="store_true")
    args, _ = ap.parse_known_args(argv)
    if not args.superexec_auth_secret_file:
        sys.exit(f"fedlm.deploy.superlink: {EXEC_FLAG} needs --superexec-auth-secret-file")
    host = f"[{args.host}]" if ":" in args.host else args.host
    cmd = ["flower-superexec", "--runtime-api-address",
           resolve_bind_address(f"{host}:{args.port}"), "--parent-pid", str(os.getpid()),
           "--superexec-auth-secret-file", args.superexec_auth_secret_file]
    cmd += (["--root-certificates", args.ssl_ca_certfile] if args.ssl_certfile
            else ["--insecure"])
    if not (args.disable_runtime_dependency_installation
            or os.environ.get("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION") == "1"):
        cmd.append("--allow-runtime-dependency-installation")  # the SuperLink's default
    return cmd


def main() -> None:
    from flwr.superlink.cli import flower_superlink

    token_file, argv = split_token_file(sys.argv[1:])
    if token_file is not None:
        with open(token_file, encoding="ascii") as fh:  # read once: a new token needs a restart
            token = fh.read().strip()
        print(patches.owner_token(token).describe(), file=sys.stderr, flush=True)
    if EXEC_FLAG in argv:
        argv = [a for a in argv if a != EXEC_FLAG]
        if "--isolation" not in argv:
            argv += ["--isolation", "process"]
        # as Flower's subprocess isolation does: one SuperExec, not restarted (it ends
        # with this process: its --parent-pid; stop() ends the process group)
        subprocess.Popen(superexec_command(argv))
    sys.argv = ["flower-superlink", *argv]
    flower_superlink()


if __name__ == "__main__":
    main()
