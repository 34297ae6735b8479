"""One run of ``fedlm deploy local``: what a deployment refuses before anything starts
(settings it would not apply, a home that is not fedlm's, data that cannot be split over
its workers), then a ``LocalDeployment`` started, the run on it (wall clock), and every
process stopped."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from fedlm import data as data_lib
from fedlm.config import Config
from fedlm.deploy import home as home_lib
from fedlm.deploy.local import LocalDeployment
from fedlm.errors import ConfigError


def check_config(cfg: Config) -> None:
    """Settings a deployment would not apply are refused, not ignored (before anything
    starts or is written)."""
    if cfg.sim.batched == "on":
        raise ConfigError("sim.batched: 'on' trains jobs together in one process; `fedlm "
                          "deploy` runs each job in its SuperNode's ClientApp: use `fedlm run "
                          "--backend inprocess`, or sim.batched = off")


class Deployed(NamedTuple):
    status: int  # flwr run's exit status
    run_id: int | None  # the run the ServerApp stored (None: it stored none)


def main_local(cfg: Config, overrides: list[str], db: str, home: Path,
               config_path: str | None, *, tls: bool = True, auth: bool = True) -> Deployed:
    """`fedlm deploy local`: start, run (wall clock), stop. Returns ``flwr run``'s
    status and the id of the run, as the ServerApp reported it (other runs may land
    in the same store meanwhile).

    TLS and SuperNode authentication are on unless ``tls``/``auth`` say otherwise.
    A config it would not apply (``check_config``) or a ``home`` that is not fedlm's
    (``fedlm.deploy.home.check``) is refused before anything starts.
    """
    check_config(cfg)
    home_lib.check(home)
    # data that cannot be split over the workers (too few documents of a text: or
    # hf: source for a by-play partition, a worker left empty): refused here, before
    # a process starts or the ServerApp stores the run (no tokenizing bar: one line)
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    data_lib.partition(data_lib.load_corpus(cfg.data), cfg.data, cfg.workers, cfg.seed)
    overrides = [*overrides, "clock=wall"] if cfg.clock != "wall" else list(overrides)
    with LocalDeployment(home, cfg.workers, tls=tls, auth=auth and tls) as dep:
        dep.start(cfg)
        security = ", ".join([*(["TLS"] if dep.tls else ["insecure"]),
                              *(["SuperNode authentication"] if dep.auth else []),
                              *(["owner token"] if dep.owner_token else [])])
        print(f"fedlm: SuperLink on {dep.address} ({security}), {cfg.workers} SuperNodes; "
              f"logs in {home}", flush=True)
        status = dep.run(overrides, str(Path(db).resolve()),
                         str(Path(config_path).resolve()) if config_path else None)
        return Deployed(status, dep.run_id())
