"""Flower's deployment engine on this machine: a SuperLink and one SuperNode per worker.

    fedlm deploy local --workers 4 [CONFIG.toml] [--set key=value ...] [--db PATH]

starts ``flower-superlink`` and N ``flower-supernode`` processes on 127.0.0.1
(free ports), each SuperNode with ``--node-config`` carrying its partition and
hardware profile, runs the app with ``flwr run`` against them, and stops every
process it started (by process group) when the run ends or fails. The engine
runs on the wall clock there (``clock = "wall"``): updates are applied in real
arrival order, which the operation log records, so ``fedlm replay`` reproduces
the run.

Secure by default (docs/deployment.md): TLS (a CA and a server certificate for
127.0.0.1/localhost made at start in ``HOME/certs``); SuperNode authentication (each
SuperNode's EC P-384 key pair in ``HOME/keys``, registered with ``flwr supernode
register`` before it starts); and only the owner may use the SuperLink (``owner_token``:
``python -m fedlm.deploy.superlink`` admits Control API requests only with the token of
``HOME/keys/control.token``, which fedlm's ``flwr`` sends from ``HOME/credentials.yaml``,
and hands ServerApp tasks only to its own signed SuperExec; HOME is 0700). HOME is fedlm's
own folder (``fedlm.deploy.home``): made with a marker, or an empty one adopted, never a
folder holding the user's files; fedlm replaces only the paths it makes there. A run uses
only the node ids registered here (``node_ids``, the run config's ``nodes``).
``tls=False, auth=False``: plain loopback (the owner token stays).

Per-message overhead: the SuperNodes run as ``python -m fedlm.deploy.supernode``
(Flower's SuperNode with its hard-coded 3 s idle poll capped; ``node_poll``) with
``--warm-executor`` (``warm_exec``): each SuperNode's ClientApps run in one warm process
(``fedlm.deploy.warm_executor``), not a process per message (Flower's SuperExec, polling
every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``: 0.2 s here, SuperNodes only). Telemetry is
off (``FLWR_TELEMETRY_ENABLED=0``: a ClientApp process waits for it at exit). The
SuperLink keeps its state in memory (``link_db_file``: a SQLite file, ~1 s more per hop
for 7 MB messages). Measurements: docs/deploy_overhead.md.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fedlm.sim import fleet as fleet_lib
from fedlm.deploy import bundle, processes, superlink
from fedlm.deploy.credentials import (make_certificates, make_node_key, make_secret,
                                      private_home, store_cli_token)
from fedlm.flower import patches
from fedlm.config import Config

ROOT = Path(__file__).resolve().parents[2]  # the repository: the Flower app `flwr run` bundles
# the SQLite files of a SuperLink with link_db_file (removed at start: a fresh state)
LINK_DB_FILES = ("superlink.db", "superlink.db-wal", "superlink.db-shm", "superlink.db-journal")
RUN_ID_FILE = "run-id"  # in the home: the id under which the ServerApp stored its run
CONNECTION = "fedlm-local"  # the connection name written to $FLWR_HOME/config.toml

# Flower's SuperExec polls its SuperNode for a new task (a message to run a
# ClientApp for) every FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds, 1.0 by default
# (flwr/supercore/superexec/run_superexec.py; accepted range 0.01 to 60). Set for
# SuperNodes without the warm executor (which starts no SuperExec).
TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
FAST_TASK_POLL = 0.2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the deployment -------------------------------------------------------------------
@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes on loopback; ``stop()`` ends them all."""

    home: Path  # FLWR_HOME: config.toml with the connection, certificates, keys, logs
    workers: int
    tls: bool = True  # serve the SuperLink over TLS (certificates made at start)
    auth: bool = True  # SuperNode authentication (needs tls)
    node_poll: bool = True  # SuperNodes as `python -m fedlm.deploy.supernode` (shorter waits)
    # ClientApps in a warm executor per SuperNode (fedlm.deploy.warm_executor), not a process
    # per message; None: on unless FEDLM_PATCH_WARM_EXECUTOR=0. Needs node_poll.
    warm_exec: bool | None = None
    # the Control API admits only requests with this deployment's token (fedlm.deploy.
    # superlink); None: on unless FEDLM_PATCH_OWNER_TOKEN=0
    owner_token: bool | None = None
    # the SuperLink's state and object store: in memory (Flower's default), or a
    # SQLite file HOME/superlink.db (True: every message's objects written to and
    # deleted from it; ~1 s more per hop for the small model, see docs/deploy_overhead.md)
    link_db_file: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)  # set last, for every process
    port: int = 0
    procs: list[subprocess.Popen] = field(default_factory=list)
    nodes: dict[str, subprocess.Popen] = field(default_factory=dict)  # name -> SuperNode
    node_ids: set[int] = field(default_factory=set)  # registered here: runs use only these
    certs: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.auth and not self.tls:
            raise ValueError("SuperNode authentication needs TLS (Flower refuses it otherwise)")
        if self.warm_exec is None:
            self.warm_exec = self.node_poll and patches.enabled(
                "warm-executor", {**os.environ, **self.extra_env})
        if self.warm_exec:
            if not self.node_poll:
                raise ValueError("the warm executor is started by fedlm.deploy.supernode: "
                                 "it needs node_poll=True")
            patches.check_supported("warm-executor")  # another flwr version: refused now
        if self.owner_token is None:
            self.owner_token = patches.enabled("owner-token", {**os.environ, **self.extra_env})
        if self.owner_token:
            patches.check_supported("owner-token")

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None
               ) -> subprocess.Popen:
        log = self.home / f"{name}.log"
        # A session of its own: SuperNodes start SuperExec children that would
        # outlive a plain kill; stop() ends the whole group.
        proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True, env=env or self.env())
        self.procs.append(proc)
        return proc

    def env(self, supernode: bool = False) -> dict[str, str]:
        """The environment of the processes started here.

        Only SuperNodes without the warm executor get the fast task poll: their
        SuperExec starts a ClientApp per message; the SuperLink's starts one
        ServerApp per run and would only spend CPU polling faster.
        """
        env = {**os.environ, "FLWR_HOME": str(self.home),
               "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
               "FLWR_TELEMETRY_ENABLED": "0"}
        env.pop(TASK_POLL_ENV, None)
        if supernode and not self.warm_exec:
            env[TASK_POLL_ENV] = str(FAST_TASK_POLL)
        env.update(self.extra_env)
        return env

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _tls_args(self, role: str) -> list[str]:
        if not self.tls:
            return ["--insecure"]
        if role == "superlink":
            return ["--ssl-ca-certfile", str(self.certs["ca"]),
                    "--ssl-certfile", str(self.certs["cert"]),
                    "--ssl-keyfile", str(self.certs["key"])]
        return ["--root-certificates", str(self.certs["ca"])]

    def start(self, cfg: Config, timeout: float = 60.0) -> "LocalDeployment":
        private_home(self.home)  # fedlm's folder (fedlm.deploy.home), else refused
        # A fresh SuperLink state: no nodes registered by an earlier deployment here
        # (only the files SQLite makes: a superlink.db.backup of the user's stays).
        for name in LINK_DB_FILES:
            (self.home / name).unlink(missing_ok=True)
        if self.tls:
            self.certs = make_certificates(self.home / "certs")
        self.port = free_port()
        # owner only: a Control API token, a signed SuperExec (fedlm.deploy.superlink)
        exe, token = superlink.command(self.home) if self.owner_token \
            else (["flower-superlink"], None)
        link = self._spawn("superlink", [
            *exe, *self._tls_args("superlink"),
            *(["--enable-supernode-auth"] if self.auth else []),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--disable-runtime-dependency-installation",
            *(["--database", str(self.home / "superlink.db")] if self.link_db_file else [])])
        self._write_connection(token)
        superlink.wait_until_listening(self.port, link, timeout, self.home / "superlink.log")
        nodes = {f"supernode{p.worker}": (f'partition-id={p.worker} num-partitions={self.workers} '
                                          f'step-time={p.step_time} region="{p.region.name}"')
                 for p in fleet_lib.profiles(cfg.fleet, self.workers)}
        keys = {}
        if self.auth:  # every key registered before its node starts (in parallel: ~2 s each)
            keys = {name: make_node_key(self.home / "keys" / name) for name in nodes}
            self.node_ids.update(self.register(*(pub for _, pub in keys.values()),
                                               timeout=timeout))
        for name, node_config in nodes.items():
            self._spawn_supernode(name, node_config, keys[name][0] if keys else None)
        return self

    def _write_connection(self, token: str | None) -> None:
        """The CLI's connection and token (while the SuperLink starts: flwr loads, ~1 s)."""
        if token is not None:
            store_cli_token(self.home, self.address, token)
        security = (f'root-certificates = "{self.certs["ca"]}"\n' if self.tls
                    else "insecure = true\n")
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{self.address}"\n{security}')

    def start_supernode(self, name: str, node_config: str, register: bool = True,
                        timeout: float = 60.0, ours: bool = True) -> subprocess.Popen:
        """Start one more SuperNode; with auth, make its key pair and (if ``register``)
        register it (an unregistered one is refused), as a stranger would if not ``ours``."""
        key = None
        if self.auth:
            key, pub = make_node_key(self.home / "keys" / name)
            if register:
                ids = self.register(pub, timeout=timeout)
                if ours:
                    self.node_ids.update(ids)
        return self._spawn_supernode(name, node_config, key)

    def _spawn_supernode(self, name: str, node_config: str, key: Path | None
                         ) -> subprocess.Popen:
        exe = [sys.executable, "-m", "fedlm.deploy.supernode"] if self.node_poll else ["flower-supernode"]
        args = [*exe, *self._tls_args("supernode"), "--superlink", self.address,
                "--port", str(free_port()), "--node-config", node_config]
        if key is not None:
            args += ["--auth-supernode-private-key", str(key)]
        if self.warm_exec:  # --isolation process; its executor signs AcquireTask
            args += ["--warm-executor", "--superexec-auth-secret-file",
                     str(make_secret(self.home / "keys" / f"{name}.superexec"))]
        proc = self._spawn(name, args, env=self.env(supernode=True))
        self.nodes[name] = proc
        return proc

    def flwr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """A ``flwr`` CLI command against this deployment's SuperLink."""
        return subprocess.run(["flwr", *args], env=self.env(), capture_output=True, text=True,
                              timeout=timeout)

    def register(self, *public_keys: Path, timeout: float = 60.0) -> list[int]:
        """``flwr supernode register``: admit the SuperNodes holding these keys.

        One ``flwr`` process per key, all at once; returns the node ids in order.
        """
        cmd = ["flwr", "supernode", "register", "{}", CONNECTION, "--format", "json"]
        procs = [subprocess.Popen([str(pub) if a == "{}" else a for a in cmd], env=self.env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for pub in public_keys]
        ids = []
        try:
            for pub, proc in zip(public_keys, procs):
                out, err = proc.communicate(timeout=timeout)
                try:
                    ids.append(int(json.loads(out[out.index("{"):])["node-id"]))
                except (ValueError, KeyError) as exc:
                    raise RuntimeError(f"flwr supernode register {pub} failed "
                                       f"({proc.returncode}): {out[-800:]} {err[-800:]}"
                                       ) from exc
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return ids

    def list_supernodes(self, timeout: float = 60.0) -> list[dict]:
        """``flwr supernode list``: the SuperLink's nodes with their status."""
        out = self.flwr("supernode", "list", CONNECTION, "--format", "json", timeout=timeout)
        try:
            data = json.loads(out.stdout[out.stdout.index("{"):])
        except ValueError as exc:
            raise RuntimeError(f"flwr supernode list failed ({out.returncode}): "
                               f"{out.stdout[-800:]} {out.stderr[-800:]}") from exc
        return list(data.get("nodes", []))

    def superlink_log(self) -> str:
        return (self.home / "superlink.log").read_text(errors="replace")

    def security_problems(self) -> list[str]:
        """What the SuperLink's own log says against TLS / auth being on (empty: all good)."""
        text = self.superlink_log()
        problems = []
        if self.tls and "running on https://" not in text:
            problems.append("the SuperLink does not serve HTTPS (no 'running on https://')")
        if self.auth and "SuperNode authentication is disabled" in text:
            problems.append("the SuperLink says: SuperNode authentication is disabled")
        if self.owner_token and superlink.OWNER_TOKEN_ON not in text:
            problems.append(f"the SuperLink does not say '{superlink.OWNER_TOKEN_ON}'")
        return problems

    def kill_node(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a SuperNode's whole process group (SuperNode, SuperExec, ClientApp)."""
        proc = self.nodes[name]
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def run(self, overrides: list[str], db: str, config_path: str | None = None,
            timeout: float | None = None, background: bool = False, app: Path = ROOT,
            run_config: str | None = None):
        """``flwr run`` of the app (the project's own files: ``bundle``) on ``fedlm-local``,
        fedlm's config in the run config. Returns its exit status, or with ``background``
        the running process (output in HOME/flwr-run.log), which the caller waits for.
        ``app`` and ``run_config`` (TOML text) run another Flower app (benchmarks)."""
        rc = self.home / "run-config.toml"
        sets = " ".join(overrides)
        self.run_id_file.unlink(missing_ok=True)  # an earlier run's id is not this one's
        # with authentication, the nodes this deployment registered: a run uses no other
        nodes = " ".join(map(str, sorted(self.node_ids))) if self.auth else ""
        rc.write_text(run_config if run_config is not None else
                      f'config = "{config_path or ""}"\nset = "{sets}"\ndb = "{db}"\n'
                      f'run-id-file = "{self.run_id_file}"\nnodes = "{nodes}"\n')
        app = bundle.stage(ROOT, self.home / "app", home=self.home) if app == ROOT else app
        args = ["flwr", "run", str(app), CONNECTION, "--run-config", str(rc), "--stream"]
        if background:
            return self._spawn("flwr-run", args)
        proc = subprocess.run(args, env=self.env(), timeout=timeout)
        return proc.returncode

    @property
    def run_id_file(self) -> Path:
        return self.home / RUN_ID_FILE

    def run_id(self) -> int | None:
        """The id under which the ServerApp of the last ``run`` stored its run (the
        ``run-id-file`` of its run config; None: it stored none)."""
        try:
            return int(self.run_id_file.read_text())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Every process it started, and what they started (``processes.stop_all``)."""
        processes.stop_all(self.procs, mark=f"FLWR_HOME={self.home}")
        self.procs.clear()
        self.nodes.clear()

    def __enter__(self) -> "LocalDeployment":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
