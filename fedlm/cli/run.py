"""``fedlm run`` (a new run, or ``--resume`` of a killed one) and ``fedlm replay``:
the commands that train, with their progress bars and what they print at the end.

The run itself is the library's: ``fedlm.runner`` (resume check, data, in-process
backend), ``fedlm.flower.simulation`` (Flower's simulation engine), ``fedlm.interrupts``
(Ctrl-C and SIGTERM stop the engine, the run is kept).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from fedlm import config_check, interrupts
from fedlm.cli.runs import print_summary
from fedlm.config import Config
from fedlm.errors import ConfigError
from fedlm.store import check_writable, resumable_row

if TYPE_CHECKING:
    from fedlm.engine import Progress


def cmd_run(args: argparse.Namespace) -> int:
    from fedlm.flower import simulation
    from fedlm.sim import codecs, memory
    from fedlm.track import Follower, with_trackers
    from fedlm.track.backends import check_installed

    cfg, db = _run_config(args)
    _check_backend(cfg, args.backend)
    cfg = with_trackers(cfg, args.track)
    if args.resume is None and cfg.init.from_:  # refused before anything is printed or stored
        from fedlm import start

        start.resolve(cfg, db)
    from fedlm.worker import optimizers

    optimizers.probe(cfg)  # a factory that fails: now, not as every worker's failed jobs
    codecs.probe(cfg)  # a codec's sizes that cannot be: now, not once the run is stored
    memory.check_fits(cfg, args.backend)  # what cannot fit is refused before it starts
    check_installed(cfg.track.backends)  # a tracker not installed: refused in one line
    check_writable(db)  # before anything is written at --db
    flower = args.backend != "inprocess"
    if flower and cfg.sim.ray_address:  # Ray would retry a head that never answers for ever
        simulation.check_ray_head(cfg.sim.ray_address)
    follower = Follower.of(db, cfg)
    simulation.quiet_libraries(flower)  # before the libraries below read the environment
    from fedlm import runner

    server = _announce(cfg, db, args.resume)  # the run's server kind: built once, here
    runner.prepare_data(cfg)
    view = _RunView(cfg, follower, quiet=args.quiet)
    from fedlm.engine import Interrupted

    # Ctrl-C / SIGTERM: ask the engine to stop; the run ends at its next step (with
    # Flower, the ServerApp returns and Ray is shut down: no actor outlives the command).
    # One that has not stopped STOP_GRACE_S later is made to: Interrupted is raised in
    # the engine's thread, whatever it is doing (and, if that thread is blocked inside C,
    # in the main thread: the process then ends without waiting for it).
    from fedlm.servers import HookTimeout

    with interrupts.stop_on_signals(view.say_stopping, overdue=Interrupted) as stopping:
        train = simulation.run_flower if flower else runner.run_inprocess
        cut = False  # a hook past its bound: the engine's thread may be stuck in C
        try:
            train(cfg, db, progress=view.on_progress, on_start=view.on_start,
                  should_stop=stopping.is_set, resume=args.resume,
                  pretrain_progress=view.on_pretrain, server=server)
        except Exception as exc:  # also re-raised from the ServerApp thread
            cut = isinstance(exc, HookTimeout)
            if view.failed(exc):
                return 1
        finally:  # the trackers get the last points and how the run ended, however it did
            if follower is not None:
                follower.end()
            if stopping.forced or cut:  # the engine's thread may be stuck in a plug-in's C call
                interrupts.exit_if_stuck(1, say=not cut)  # a cut hook said it already
    view.close()
    if view.run_id is None:
        print("fedlm: error: the simulation ended before the run started", file=sys.stderr)
        return 1
    return print_summary(db, view.run_id)


def _check_backend(cfg: Config, backend: str) -> None:
    """Settings one backend has and the other lacks are refused, not ignored."""
    if backend == "inprocess" and cfg.sim.ray_address:
        raise ConfigError("sim.ray_address: attaches Flower's Ray actors to a cluster; "
                          "--backend inprocess runs no Ray (drop one of the two)")
    if backend != "inprocess" and cfg.sim.batched == "on":
        raise ConfigError("sim.batched: 'on' trains jobs together in one process; Flower's "
                          "simulation trains each job in its own actor: use --backend "
                          "inprocess, or sim.batched = auto")


def _run_config(args: argparse.Namespace) -> tuple[Config, str]:
    """(the config, the store): a resumed run's own, or CONFIG with --set."""
    from fedlm import config_load

    if args.resume is None:
        cfg = config_load.load(args.config, args.overrides)
        return cfg, args.db or cfg.db
    if args.config or args.overrides:
        raise ConfigError("--resume: a resumed run keeps its own config; drop CONFIG "
                          "and --set")
    db = args.db or Config().db
    return config_load.from_json(resumable_row(db, args.resume)["config_json"]), db


def _announce(cfg: Config, db: str, resume: int | None):
    """The run's first line: its fleet, model, strategy, how long, where it is stored;
    then the settings that do nothing here, and a resume that starts over. Returns the
    run's server kind, built for the line, which the run then takes."""
    from fedlm import runner, servers
    from fedlm.servers.watch import bounded, plug_in_bound
    from fedlm.sim import dynamics

    stop = f"{cfg.updates} updates" + (f" or {cfg.local_step_budget} local steps"
                                       if cfg.local_step_budget > 0 else "")
    server = bounded(plug_in_bound(cfg), f"strategy {cfg.strategy}'s constructor",
                     servers.build, cfg)  # a plug-in's code: bounded as its hooks are
    versions = server.versions_wanted(cfg.updates)
    if versions != cfg.updates:  # e.g. streamed: P rounds an update, P - 1 more end it
        stop += f" ({'; '.join([*filter(None, [server.describe()]), f'{versions} versions'])})"
    fleet_words = "".join(f" + {words}" for _, words in dynamics.features(cfg.fleet))
    print(f"fedlm: {cfg.workers} workers, {cfg.fleet.preset} profile{fleet_words}, "
          f"{cfg.model} model, "
          f"{cfg.strategy} ({cfg.local_steps} local steps, H={cfg.inner.steps}), "
          f"{stop} -> {db}", flush=True)
    for note in config_check.notes(cfg):
        print(f"fedlm: note: {note}", file=sys.stderr, flush=True)
    if resume is not None and runner.resume_checkpoint(db, resume) is None:
        print(f"fedlm: no checkpoint of run {resume} next to {db}; starting over from "
              f"version 0", file=sys.stderr, flush=True)
    return server


class _RunView:
    """What ``fedlm run`` shows while a run trains: its progress bar (unless quiet), the
    trackers' follower, and how it ended."""

    def __init__(self, cfg: Config, follower, quiet: bool) -> None:
        from tqdm import tqdm

        self.follower, self.run_id = follower, None
        self.by_steps = cfg.local_step_budget > 0
        self.bar = None if quiet else tqdm(
            total=cfg.local_step_budget if self.by_steps else cfg.updates,
            unit="step" if self.by_steps else "update", dynamic_ncols=True, desc="training")

    def on_start(self, run_id: int) -> None:
        self.run_id = run_id
        if self.follower is not None:
            self.follower.begin(run_id)

    def on_progress(self, p: Progress) -> None:
        if self.follower is not None:
            self.follower.poll()
        bar = self.bar
        if bar is None:
            return
        if not self.by_steps:  # streaming rounds: a version per fragment's round
            bar.total = p.target
        bar.n = min(p.local_steps, p.budget) if self.by_steps else p.version
        ppl = f"{p.perplexity:.2f}" if p.perplexity is not None else "-"
        bar.set_postfix_str(f"v{p.version}, virtual {p.virtual_time:.0f}s, jobs {p.jobs}, "
                            f"ppl {ppl}", refresh=False)
        bar.refresh()

    def on_pretrain(self, done: int, total: int) -> None:
        if self.bar is not None:  # init.pretrain_steps: shown on the same line first
            self.bar.set_description_str("training" if done >= total
                                         else f"pretraining {done}/{total} steps")

    @staticmethod
    def say_stopping() -> None:
        print("\nfedlm: stopping (the run is kept, marked interrupted)...", file=sys.stderr,
              flush=True)

    def failed(self, exc: Exception) -> bool:
        """Whether the run failed (said in one line); a stop on request or a divergence is
        no failure (the summary says so); before the run started, the error is raised."""
        if self.run_id is None or os.environ.get("FEDLM_DEBUG"):
            raise exc
        from fedlm import runner
        from fedlm.engine import Diverged, Interrupted

        if isinstance(exc, (Interrupted, Diverged)):
            return False
        self.close()  # the store has the reason too, unless writing it was what failed
        print(f"fedlm: error: run {self.run_id} failed: {runner.failure_reason(exc)}",
              file=sys.stderr)
        return True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def cmd_replay(args: argparse.Namespace) -> int:
    from fedlm import store

    # bad db, unknown run, a run that did not finish: refused here, before any library
    # loads or any progress shows
    store.replayable_row(args.db or Config().db, args.run_id)
    from tqdm import tqdm

    from fedlm.flower import simulation
    from fedlm.replay import describe, replay

    simulation.quiet_libraries(flower=False)  # replay runs no Flower
    # One bar per phase, made as the phase starts, so that each ETA counts only its own
    # work: recomputing the start (init.pretrain_steps) can take longer than the log.
    bars: dict[str, tqdm] = {}

    def phase(name: str, done: int, total: int, **kwargs) -> None:
        if name not in bars:
            for bar in bars.values():
                bar.close()
            bars[name] = tqdm(total=total, dynamic_ncols=True, **kwargs)
        bars[name].update(done - bars[name].n)

    def on_pretrain(done: int, total: int) -> None:
        phase("start", done, total, unit="step",
              desc=f"recomputing the start (pretraining {total} steps)")

    def on_progress(done: int, total: int) -> None:
        phase("replay", done, total, unit="op", desc=f"replaying {total} operations")

    try:
        result = replay(args.db or Config().db, args.run_id, on_progress, on_pretrain)
    finally:
        for bar in bars.values():
            bar.close()
    print(describe(result))
    return 0 if result.identical else 1
