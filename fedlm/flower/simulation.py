"""``fedlm run`` on Flower's simulation engine: ``run_simulation`` in this process,
the ServerApp driving the engine, the ClientApps as Ray actors.

``run_simulation`` is marked deprecated since flwr 1.41; we use it on purpose: it
runs in-process and leaves no daemon behind (see docs/architecture.md). What it
needs around it lives here: the libraries quieted (``quiet_libraries``), Ray's
resources (``backend_config``), and our SIGTERM handler kept (``run_flower``, with
``fedlm.flower.patches.ray_keeps_sigterm``).

Flower and Ray are imported only when a run uses them (importing Flower costs
about a second), and after ``quiet_libraries`` has set the environment they read.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

from fedlm import interrupts
from fedlm.sim import fleet
from fedlm.config import Config
from fedlm.errors import ConfigError

RAY_HEAD_TIMEOUT_S = 10.0  # how long a Ray head has to accept a connection


def quiet_libraries(flower: bool = True) -> None:
    """Quiet Ray, Flower and datasets; imports Flower only when the run uses it
    (importing it costs about a second per in-process run)."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("TQDM_DISABLE", "")  # leave tqdm on for our bar
    # read by `datasets` when (and if) it is imported: no import needed here
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    # Ray's C++ crash handler takes SIGTERM too; after it has run, the process
    # aborts on its way out instead of ending the run cleanly (see run_flower).
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    if flower:
        import flwr.simulation  # noqa: F401  (configures flwr's logger; quiet it after)

        # ERROR: hides run_simulation's deprecation notice (we use it on purpose: it
        # runs in-process and leaves no daemon behind; see docs/architecture.md).
        logging.getLogger("flwr").setLevel(logging.ERROR)


def backend_config(cfg: Config) -> dict:
    """Ray resources: ``actors`` ClientApp actors sharing ``cpus`` (fractions allowed)
    and, on CUDA, the host's GPUs (``fedlm.worker.placement.gpu_share``: Ray hands each
    actor its own GPU, so ``"cuda"`` in an actor is that one).

    By default one actor per core: a job trains on ``inner.threads`` (1) threads, so
    more actors than cores only compete (measured on 2 cores: the default run took
    150 s with 2 actors against 177 s with 4, the same weights).

    With ``sim.ray_address`` Ray is not started but attached to (``ray.init(address=)``
    through Flower's ``init_args``, which takes no resource counts then: the cluster
    has them): each actor asks for ``sim.cpus / actors`` CPUs (``inner.threads`` when
    ``sim.cpus`` is 0) and its GPU share, and Flower starts as many actors as the
    cluster's nodes hold."""
    from fedlm.worker import placement  # torch: only once a run is starting

    logs = {"logging_level": "ERROR", "log_to_driver": True}
    nodes = fleet.node_count(cfg)
    if cfg.sim.ray_address:  # the cluster's cores are not known here: one actor per worker
        actors = cfg.sim.ray_actors or nodes
        share = placement.gpu_share(actors, placement.gpu_count(cfg))
        cpus = cfg.sim.cpus / actors if cfg.sim.cpus else cfg.inner.threads
        return {"client_resources": {"num_cpus": cpus, "num_gpus": share},
                "init_args": {"address": cfg.sim.ray_address, **logs}}
    cpus = cfg.sim.cpus or (os.cpu_count() or 1)
    actors = cfg.sim.ray_actors or min(nodes, cpus)
    gpus = placement.gpu_count(cfg)
    # "local": a Ray of our own even where `ray start` ran on this host (a plain
    # ray.init() would join that cluster, found in /tmp/ray/ray_current_cluster or
    # RAY_ADDRESS, and then refuse num_cpus)
    return {"client_resources": {"num_cpus": cpus / actors,
                                 "num_gpus": placement.gpu_share(actors, gpus)},
            "init_args": {"address": "local", "num_cpus": cpus, "num_gpus": gpus,
                          "include_dashboard": False, **logs}}


def run_flower(cfg: Config, db_path: str, **kwargs) -> None:
    """Run ``cfg`` into the store at ``db_path`` on Flower's simulation engine.

    ``kwargs`` are ``fedlm.flower.server_app.make_server_app``'s (``progress``, ``on_start``,
    ``should_stop``, ``resume``, ``pretrain_progress``). An error of the run is
    re-raised here from the ServerApp's thread; when ``should_stop`` turns true the
    ServerApp returns and ``run_simulation`` shuts Ray down, so no actor outlives
    the call."""
    from flwr.simulation import run_simulation

    from fedlm.flower import leftovers, patches

    # ray.init (in run_simulation) replaces the SIGTERM handler with one that
    # exits at once, leaving the run marked "running". Keep ours: it stops
    # the engine, and run_simulation then shuts Ray down as on a normal end.
    patches.ray_keeps_sigterm()
    from fedlm.flower.client_app import app as client_app
    from fedlm.flower.server_app import make_server_app

    run_ids: list[int] = []
    on_start = kwargs.get("on_start") or (lambda run_id: None)

    def started(run_id: int) -> None:
        run_ids.append(run_id)
        on_start(run_id)

    flwr_log = logging.getLogger("flwr")
    flwr_log.addFilter(_NOT_OURS)
    try:
        with leftovers.none_left_behind():
            run_simulation(server_app=make_server_app(cfg, db_path, **{**kwargs,
                                                                        "on_start": started}),
                           client_app=client_app, num_supernodes=fleet.node_count(cfg),
                           backend_config=backend_config(cfg))
    except BaseException as exc:
        cause = interrupts.take_ending() or ours(exc)
        if cause is None:
            raise
        if run_ids:  # the engine's thread, blocked, will never record how it ended
            from fedlm import runner, store

            store.end_if_running(db_path, run_ids[-1], status=runner.end_status(cause),
                                 error=runner.failure_reason(cause))
        raise cause from None
    finally:
        flwr_log.removeFilter(_NOT_OURS)


def ours(exc: BaseException | None) -> BaseException | None:
    """fedlm's own reason a run ended (a stop asked for, a hook past its bound), found in
    the chain of what Flower raised around it ("An error was encountered"), or None."""
    from fedlm.engine.types import Interrupted
    from fedlm.servers.watch import HookTimeout

    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (Interrupted, HookTimeout)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class _NotOurs(logging.Filter):
    """Drops what Flower logs about an exception of fedlm's own making (its tracebacks of
    a stop fedlm forced): the command says how the run ended, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return ours(sys.exc_info()[1]) is None


_NOT_OURS = _NotOurs()


def check_ray_head(address: str, timeout: float = RAY_HEAD_TIMEOUT_S) -> str:
    """The ``HOST:PORT`` of the Ray head that ``address`` (``sim.ray_address``: one, or
    ``auto``) names, once its GCS answered within about ``timeout`` seconds; else a
    one-line ``ConfigError``. ``ray.init`` itself retries a head that does not answer
    for ever (also a port where something else listens), and on ``auto`` with no
    cluster prints tracebacks and then waits. The GCS is asked in a child process,
    whose wait Ray bounds (``RAY_py_gcs_connect_timeout_s``) and we kill past it."""
    from fedlm.flower import patches

    head = patches.ray_head_address(address)
    if head is None:
        raise ConfigError(f"sim.ray_address: {address!r}: no Ray cluster found on this "
                          f"host (`ray start --head` starts one; RAY_ADDRESS names one)")
    host, _, port = head.rpartition(":")
    refused = f"sim.ray_address: no Ray head answers at {head} within {timeout:g} s"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise ConfigError(f"{refused} ({why})") from None
    env = dict(os.environ, RAY_py_gcs_connect_timeout_s=str(max(1, int(timeout / 2))))
    probe = [sys.executable, "-c", "import sys, ray._raylet as r; r.GcsClient(address=sys.argv[1])",
             head]
    try:
        done = subprocess.run(probe, env=env, capture_output=True, timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{refused} (something listens there, but not Ray)") from None
    if done.returncode != 0:
        raise ConfigError(f"{refused} (its port accepts, but no Ray GCS replies)")
    return head
