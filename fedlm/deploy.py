"""Flower's deployment engine on this machine: a SuperLink and one SuperNode per worker.

    fedlm deploy local --workers 4 [CONFIG.toml] [--set key=value ...] [--db PATH]

starts ``flower-superlink`` and N ``flower-supernode`` processes on 127.0.0.1
(free ports), each SuperNode with ``--node-config`` carrying its partition and
hardware profile, runs the app with ``flwr run`` against them, and stops every
process it started (by process group) when the run ends or fails. The engine
runs on the wall clock there (``clock = "wall"``): updates are applied in real
arrival order, which the operation log records, so ``fedlm replay`` reproduces
the run.

The same commands work across machines: start the SuperLink on one host and a
SuperNode per worker on others, pointing ``--superlink`` at it (use TLS there:
Flower's --ssl-* and --root-certificates flags).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedlm import fleet as fleet_lib
from fedlm.config import Config

ROOT = Path(__file__).resolve().parent.parent
CONNECTION = "fedlm-local"  # the connection name written to $FLWR_HOME/config.toml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float, log: Path) -> None:
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


@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes on loopback; ``stop()`` ends them all."""

    home: Path  # FLWR_HOME: config.toml with the connection, and the logs
    workers: int
    port: int = 0
    procs: list[subprocess.Popen] = field(default_factory=list)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.home / f"{name}.log"
        # A session of its own: SuperNodes start SuperExec children that would
        # outlive a plain kill; stop() ends the whole group.
        proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True, env=self.env())
        self.procs.append(proc)
        return proc

    def env(self) -> dict[str, str]:
        return {**os.environ, "FLWR_HOME": str(self.home),
                "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}

    def start(self, cfg: Config, timeout: float = 60.0) -> "LocalDeployment":
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        link = self._spawn("superlink", [
            "flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(self.port),
            "--disable-runtime-dependency-installation",
            "--database", str(self.home / "superlink.db")])
        _wait_for_port(self.port, link, timeout, self.home / "superlink.log")
        for p in fleet_lib.profiles(cfg.fleet, self.workers):
            node_config = (f'partition-id={p.worker} num-partitions={self.workers} '
                           f'step-time={p.step_time} region="{p.region.name}"')
            self._spawn(f"supernode{p.worker}", [
                "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                "--port", str(free_port()), "--node-config", node_config])
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        return self

    def run(self, overrides: list[str], db: str, config_path: str | None = None,
            timeout: float | None = None) -> int:
        """``flwr run . fedlm-local`` with fedlm's config in the run config; returns its status."""
        rc = self.home / "run-config.toml"
        sets = " ".join(overrides)
        rc.write_text(f'config = "{config_path or ""}"\nset = "{sets}"\ndb = "{db}"\n')
        proc = subprocess.run(["flwr", "run", str(ROOT), CONNECTION, "--run-config", str(rc),
                               "--stream"], env=self.env(), timeout=timeout)
        return proc.returncode

    def stop(self) -> None:
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()

    def __enter__(self) -> "LocalDeployment":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main_local(cfg: Config, overrides: list[str], db: str, home: Path,
               config_path: str | None) -> int:
    """`fedlm deploy local`: start, run (wall clock), stop."""
    overrides = [*overrides, "clock=wall"] if cfg.clock != "wall" else list(overrides)
    with LocalDeployment(home, cfg.workers) as dep:
        dep.start(cfg)
        print(f"fedlm: SuperLink on 127.0.0.1:{dep.port}, {cfg.workers} SuperNodes; "
              f"logs in {home}", flush=True)
        status = dep.run(overrides, str(Path(db).resolve()),
                         str(Path(config_path).resolve()) if config_path else None)
    return status

