"""The ``fedlm`` command line.

    fedlm run [CONFIG.toml] [--set key=value ...] [--db PATH]   train, on Flower's simulation engine
    fedlm run --resume RUN_ID [--db PATH]                       continue a killed run (checkpoints)
    fedlm runs [--db PATH]                                      list stored runs
    fedlm show RUN_ID [--db PATH]                               a run's summary
    fedlm export RUN_ID [--db PATH] [--format csv|parquet]      a run's tables as files
    fedlm config [CONFIG.toml] [--set key=value ...]            print the resolved config
    fedlm replay RUN_ID [--db PATH]                             re-execute a run from its log
    fedlm strategies                                            list strategies and policies
    fedlm dashboard [--db PATH] [--port N]                      the live Streamlit dashboard
    fedlm sweep SPEC.toml [--quick] [--backend B] [--jobs N]    strategies x profiles, one report
    fedlm deploy local --workers N [CONFIG] [--set ...]         SuperLink + SuperNodes on loopback
    fedlm plan --params 1e9 --workers 8 [--plot DIR]            cost model: sync vs async, no run

Bad input ends with one line, ``fedlm: error: FIELD: ...``, and exit status 2.

Each command imports what it needs when it runs (the config loader pulls in numpy and
the strategies; runs and replay, torch), so that ``fedlm runs``, ``show`` and usage
errors answer at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sqlite3
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from fedlm.config import Config
from fedlm.errors import ConfigError
from fedlm.store import StoreError, check_writable


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line too (exit status 2), like every other."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(message: object) -> str:
    text = str(message)
    if text.splitlines() == [text]:
        return text
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _int_arg(low: int, high: int, expected: str):
    """An argparse ``type``: an int in [low, high], else ``must be EXPECTED, got ...``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
        return value
    return parse


_run_id = _int_arg(1, 2**63 - 1, "a run id >= 1")
_positive_int = _int_arg(1, 1024, "between 1 and 1024")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="TOML config file (default: the embedded default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set strategy=fedavg --set inner.lr=1e-3")


def _db_path(text: str) -> str:
    """An argparse ``type`` for --db: a path, never the empty string (which would
    otherwise fall back to the default database without a word)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a path, got {text!r}")
    return text


def _add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=_db_path, default=None, help="run database (default: the "
                   "config's db, runs/fedlm.db)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedlm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a simulation on Flower's simulation engine")
    _add_config_args(p)
    _add_db_arg(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--backend", choices=("flower", "inprocess"), default="flower",
                   help="flower: Flower's simulation engine (Ray actors, the default); "
                        "inprocess: every job in this process, no Ray (debugging, sweeps)")
    p.add_argument("--resume", type=_run_id, default=None, metavar="RUN_ID",
                   help="continue run RUN_ID of --db from its newest intact checkpoint "
                        "(with its own config: no CONFIG or --set)")

    p = sub.add_parser("runs", help="list stored runs")
    _add_db_arg(p)

    p = sub.add_parser("show", help="summary of one run")
    p.add_argument("run_id", type=_run_id)
    _add_db_arg(p)

    p = sub.add_parser("export", help="write a run's tables as CSV or Parquet")
    p.add_argument("run_id", type=_run_id)
    _add_db_arg(p)
    p.add_argument("--format", choices=("csv", "parquet"), default="csv")
    p.add_argument("--out", default="runs/export", help="output folder (default: runs/export)")

    p = sub.add_parser("config", help="print the resolved config as TOML")
    _add_config_args(p)

    p = sub.add_parser("replay", help="re-execute a run from its operation log and compare "
                       "the final weights' hash")
    p.add_argument("run_id", type=_run_id)
    _add_db_arg(p)

    sub.add_parser("strategies", help="list the available strategies and local-steps policies")

    p = sub.add_parser("sweep", help="run strategies x heterogeneity profiles and write a "
                       "report with tables and plots")
    p.add_argument("spec", help="sweep spec, e.g. experiments/configs/paper.toml")
    p.add_argument("--quick", action="store_true", help="the spec's reduced [quick] version")
    p.add_argument("--backend", choices=("flower", "inprocess"), default="flower")
    p.add_argument("--rerun", action="store_true", help="ignore finished runs of the same name")
    p.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                   help="runs at once (in-process backend; results do not change; default 1)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed run "
                   "(default: report it and go on with the others)")
    p.add_argument("--db", type=_db_path, default=None, help="override the spec's run database")
    p.add_argument("--out", default=None, help="override the spec's report path")

    p = sub.add_parser("deploy", help="run on Flower's deployment engine (SuperLink + "
                       "SuperNodes) on this machine")
    p.add_argument("where", choices=("local",), help="local: every process on 127.0.0.1")
    p.add_argument("--workers", type=int, default=None, help="SuperNodes (default: config's)")
    _add_config_args(p)
    _add_db_arg(p)
    p.add_argument("--home", default="runs/deploy", help="FLWR_HOME and logs (default: "
                   "runs/deploy)")

    p = sub.add_parser("plan", help="cost model: time per outer step, communication, "
                       "utilisation and idle time of sync and async training (no run)")
    from fedlm import cli_plan  # the command's flags, with the parsing of their text

    cli_plan.add_arguments(p)

    p = sub.add_parser("dashboard", help="serve the live dashboard (Streamlit)")
    _add_db_arg(p)
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default: loopback)")
    return parser


# ---------------------------------------------------------------------------

def _quiet_libraries(flower: bool = True) -> None:
    """Quiet Ray, Flower and datasets; imports Flower only when the run uses it
    (importing it costs about a second per in-process run)."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("TQDM_DISABLE", "")  # leave tqdm on for our bar
    # read by `datasets` when (and if) it is imported: no import needed here
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    # Ray's C++ crash handler takes SIGTERM too; after it has run, the process
    # aborts on its way out instead of ending the run cleanly (see cmd_run).
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    if flower:
        import flwr.simulation  # noqa: F401  (configures flwr's logger; quiet it after)

        # ERROR: hides run_simulation's deprecation notice (we use it on purpose: it
        # runs in-process and leaves no daemon behind; see docs/architecture.md).
        logging.getLogger("flwr").setLevel(logging.ERROR)


def backend_config(cfg: Config) -> dict:
    """Ray resources: ``actors`` ClientApp actors sharing ``cpus`` (fractions allowed).

    By default one actor per core: a job trains on ``inner.threads`` (1) threads, so
    more actors than cores only compete (measured on 2 cores: the default run took
    150 s with 2 actors against 177 s with 4, the same weights)."""
    from fedlm import fleet
    from fedlm.model import resolve_device

    cpus = cfg.sim.cpus or (os.cpu_count() or 1)
    actors = cfg.sim.actors or min(fleet.node_count(cfg), cpus)
    gpus = 1.0 / actors if resolve_device(cfg.device) == "cuda" else 0.0
    return {"client_resources": {"num_cpus": cpus / actors, "num_gpus": gpus},
            "init_args": {"num_cpus": cpus, "num_gpus": 1 if gpus else 0,
                          "logging_level": "ERROR", "log_to_driver": True,
                          "include_dashboard": False}}


def _resumable(db: str, run_id: int) -> Config:
    """The config of run ``run_id`` in ``db``, if it is a run that can be resumed."""
    from fedlm import config_load, store

    if not Path(db).exists():
        raise StoreError(f"db: no run database at {db}")
    row = store.run_row(db, run_id)
    if row is None:
        raise StoreError(f"--resume: no run {run_id} in {db}")
    if row["status"] == "finished":
        raise StoreError(f"--resume: run {run_id} in {db} has already finished")
    if store.shown_status(row) == "running":  # checked again when the run is taken over
        raise StoreError(f"--resume: run {run_id} in {db} is still running (pid "
                         f"{row['owner_pid']} on {row['owner_host']}); two writers would "
                         f"break its log")
    return config_load.from_json(row["config_json"])


def cmd_run(args: argparse.Namespace) -> int:
    from fedlm import config_load, fleet

    if args.resume is not None:
        if args.config or args.overrides:
            raise ConfigError("--resume: a resumed run keeps its own config; drop CONFIG "
                              "and --set")
        db = args.db or Config().db
        cfg = _resumable(db, args.resume)
    else:
        cfg = config_load.load(args.config, args.overrides)
        db = args.db or cfg.db
    by_steps = cfg.local_step_budget > 0
    check_writable(db)
    flower = args.backend != "inprocess"
    _quiet_libraries(flower)
    from tqdm import tqdm

    from fedlm import data
    from fedlm.engine import Progress
    from fedlm.runner import run_inprocess

    stop = f"{cfg.updates} updates" + (f" or {cfg.local_step_budget} local steps"
                                       if by_steps else "")
    print(f"fedlm: {cfg.workers} workers, {cfg.fleet.preset} profile, {cfg.model} model, "
          f"{cfg.strategy} ({cfg.local_steps} local steps, H={cfg.inner.steps}), "
          f"{stop} -> {db}", flush=True)
    data.load_corpus(cfg.data)  # tokenize once here, not in every Ray actor at once
    from fedlm.worker import data_shards

    data_shards(cfg.data, cfg.shard_count(), cfg.seed)  # e.g. too few documents: before it is stored
    started: dict[str, int] = {}
    bar = None if args.quiet else tqdm(
        total=cfg.local_step_budget if by_steps else cfg.updates,
        unit="step" if by_steps else "update", dynamic_ncols=True, desc="training")

    def on_progress(p: Progress) -> None:
        if bar is None:
            return
        bar.n = min(p.local_steps, p.budget) if by_steps else p.version
        ppl = f"{p.perplexity:.2f}" if p.perplexity is not None else "-"
        bar.set_postfix_str(f"v{p.version}, virtual {p.virtual_time:.0f}s, jobs {p.jobs}, "
                            f"ppl {ppl}",
                            refresh=False)
        bar.refresh()

    def on_pretrain(done: int, total: int) -> None:
        if bar is not None:  # init.pretrain_steps: shown on the same line before training
            bar.set_description_str("training" if done >= total
                                    else f"pretraining {done}/{total} steps")

    # Ctrl-C / SIGTERM: ask the engine to stop; the ServerApp then returns and
    # run_simulation shuts Ray down, so no actor outlives the command.
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        if not stop.is_set():
            print("\nfedlm: stopping (the run is kept, marked interrupted)...", file=sys.stderr,
                  flush=True)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if not flower:
            run_inprocess(cfg, db, progress=on_progress,
                          on_start=lambda rid: started.update(id=rid), should_stop=stop.is_set,
                          resume=args.resume, pretrain_progress=on_pretrain)
        else:
            import ray._private.utils
            from flwr.simulation import run_simulation

            # ray.init (in run_simulation) replaces the SIGTERM handler with one that
            # exits at once, leaving the run marked "running". Keep ours: it stops
            # the engine, and run_simulation then shuts Ray down as on a normal end.
            ray._private.utils.set_sigterm_handler = lambda handler: None

            from fedlm.client_app import app as client_app
            from fedlm.server_app import make_server_app

            server = make_server_app(cfg, db, on_progress,
                                     on_start=lambda rid: started.update(id=rid),
                                     should_stop=stop.is_set, resume=args.resume,
                                     pretrain_progress=on_pretrain)
            run_simulation(server_app=server, client_app=client_app,
                           num_supernodes=fleet.node_count(cfg),
                           backend_config=backend_config(cfg))
    except Exception as exc:  # also re-raised from the ServerApp thread
        if "id" not in started or os.environ.get("FEDLM_DEBUG"):
            raise
        from fedlm.engine import Interrupted
        from fedlm.runner import failure_reason

        if not isinstance(exc, Interrupted):  # stopped on request: the summary says so
            # the store has the reason too, unless writing it was what failed
            if bar is not None:
                bar.close()
            print(f"fedlm: error: run {started['id']} failed: {failure_reason(exc)}",
                  file=sys.stderr)
            return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if bar is not None:
        bar.close()
    if "id" not in started:
        print("fedlm: error: the simulation ended before the run started", file=sys.stderr)
        return 1
    return _print_summary(db, started["id"])


def _print_summary(db: str, run_id: int) -> int:
    from fedlm import store

    s = store.summarize(db, run_id)
    if s.status != "finished":
        row = store.run_row(db, run_id)
        why = row["error"] or "still running"
        if s.status == "crashed":
            why = (f"its writer (pid {row['owner_pid']} on {row['owner_host']}) is gone, last "
                   f"seen {store.last_seen(row)}; `fedlm run --resume {run_id} --db {db}` "
                   f"continues it")
        print(f"fedlm: run {run_id} {s.status}: {why}", file=sys.stderr)
        return 130 if s.status == "interrupted" else 1
    first = f"{s.first_perplexity:.2f}" if s.first_perplexity else "-"
    final = f"{s.final_perplexity:.2f}" if s.final_perplexity else "-"
    print(f"\nrun {s.run_id} ({s.name}): {s.strategy}, {s.profile}, {s.model} model")
    print(f"  validation perplexity {first} -> {final} (best {s.best_perplexity:.2f})")
    clock = "virtual time" if s.mode == "virtual" else "wall-clock time"
    print(f"  {s.updates} updates from {s.jobs} jobs, {s.local_steps:,} local steps, "
          f"{s.tokens:,} tokens; {clock} {s.virtual_time:.1f} s, real time {s.wall_time:.1f} s")
    print(f"  {'worker':>6} {'s/step':>7} {'region':>6} {'jobs':>5} {'compute':>9} "
          f"{'comm':>8} {'idle':>9} {'idle %':>7}")
    for w in s.workers:
        print(f"  {w.worker:>6} {w.step_time:>7.2f} {w.region:>6} {w.jobs:>5} {w.compute:>9.1f} "
              f"{w.communication:>8.2f} {w.idle:>9.1f} {100 * w.idle_fraction:>6.1f}%")
    print(f"  straggler idle fraction (all workers): {100 * s.idle_fraction:.1f}%")
    _print_troubles(store.troubles(db, run_id))
    print(f"  stored in {db} (run {s.run_id}); `fedlm show {s.run_id} --db {db}`")
    return 0


def _print_troubles(t) -> None:
    """Faults, lost jobs and retired workers (``store.troubles``), if there were any."""
    if not t:
        return

    def by(counts: dict) -> str:
        return ", ".join(f"{k} {n}" for k, n in counts.items())

    print("  faults and failures:")
    if t.faults:
        print(f"    faults injected: {by(t.faults)}")
    if t.lost:
        print(f"    jobs lost: {sum(t.lost.values())} ({by(t.lost)})")
    for worker, why in t.retired:
        print(f"    worker {worker} retired: {why}")
    if t.rounds_closed:
        print(f"    sync rounds closed at their deadline without every reply: {t.rounds_closed}")
    if t.ignored:
        print(f"    replies ignored: {by(t.ignored)}")
    if t.offline:
        print("    offline periods: " + ", ".join(f"worker {w} {n}"
                                                   for w, n in t.offline.items()))


def cmd_runs(args: argparse.Namespace) -> int:
    from fedlm import store

    db = args.db or Config().db
    rows = store.list_runs(db)
    if not rows:
        print(f"no runs in {db}")
        return 0
    print(f"{'id':>4} {'status':>9} {'strategy':>16} {'profile':>11} {'model':>6} "
          f"{'workers':>7} {'updates':>7} {'virtual s':>10} {'ppl':>8}  name")
    for r in rows:
        ppl = f"{r['last_perplexity']:.2f}" if r["last_perplexity"] else "-"
        vt = f"{r['virtual_time']:.1f}" if r["virtual_time"] is not None else "-"
        print(f"{r['id']:>4} {r['status']:>9} {r['strategy']:>16} {r['profile']:>11} "
              f"{r['model']:>6} {r['workers']:>7} {r['updates'] or 0:>7} {vt:>10} {ppl:>8}  "
              f"{r['name']}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    return _print_summary(args.db or Config().db, args.run_id)


def cmd_export(args: argparse.Namespace) -> int:
    from fedlm import store

    store.config_of(args.db or Config().db, args.run_id)  # bad db, unknown run: no --out made
    for path in store.export(args.db or Config().db, args.run_id, args.out, args.format):
        print(path)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    import tomli_w

    from fedlm import config_load

    cfg = config_load.load(args.config, args.overrides)
    print(tomli_w.dumps(cfg.to_dict()), end="")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fedlm import store
    from fedlm.replay import describe, replay

    store.config_of(args.db or Config().db, args.run_id)  # bad db, unknown run: fail here
    _quiet_libraries()
    bar = tqdm(unit="op", desc="replaying", dynamic_ncols=True)

    def on_progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    result = replay(args.db or Config().db, args.run_id, on_progress)
    bar.close()
    print(describe(result))
    return 0 if result.identical else 1


def cmd_strategies(args: argparse.Namespace) -> int:
    from fedlm.strategies.registry import describe

    for name, kind, line in describe():
        print(f"{name:<18} {kind:<12} {line}")
    print("\nplug in your own: --set strategy=package.module:Class, or an entry point in the "
          "'fedlm.strategies' group (docs/strategies.md)")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedlm import sweep

    sweep.check_jobs(args.jobs, args.backend)  # before the spec is read or a run starts
    spec = sweep.load_spec(args.spec, args.quick)
    if args.db:
        spec["db"] = args.db
    if args.out:
        spec["out"] = args.out
    check_writable(spec["db"])  # one line now, not one failed cell after another
    try:
        result = sweep.run_sweep(spec, backend=args.backend, rerun=args.rerun, jobs=args.jobs,
                                 fail_fast=args.fail_fast)
    except (KeyboardInterrupt, sweep.SweepStopped):
        print("fedlm: sweep stopped; its runs are kept (interrupted ones marked so)",
              file=sys.stderr)
        return 130
    cells, failures = result.cells, result.failures
    if cells:
        text, written = sweep.write_report(spec, result)
        print(text)
        print(f"wrote {', '.join(str(p) for p in written)}")
    for f in failures:
        print(f"fedlm: error: sweep cell {f.arm} @ {f.profile} failed: {_one_line(f.reason)}",
              file=sys.stderr)
    total = len(spec["profiles"]) * len(spec["arm"])
    if failures or result.stopped:
        print(f"fedlm: {len(cells)} of {total} cells finished, {len(failures)} failed"
              + (" (stopped at the first failure: --fail-fast)" if result.stopped else ""),
              file=sys.stderr)
        return 1
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from fedlm import config_load, deploy

    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"workers={args.workers}")
    cfg = config_load.load(args.config, overrides)
    db = args.db or cfg.db
    check_writable(db)
    with _signals_interrupt():  # SIGTERM too: the deployment's processes are stopped
        status = deploy.main_local(cfg, overrides, db, Path(args.home).resolve(), args.config)
    if status != 0:
        print(f"fedlm: error: flwr run exited with {status}; logs in {args.home}",
              file=sys.stderr)
        return 1
    from fedlm import store

    return _print_summary(db, max(r["id"] for r in store.list_runs(db)))


@contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP end the command as Ctrl-C does (KeyboardInterrupt), so that
    what it cleans up on the way out (``LocalDeployment.stop``: every process it
    started) is cleaned up; a second signal while that runs (bounded) is ignored
    rather than cutting it short and leaving processes behind."""
    received: list[int] = []

    def on_signal(signum, frame) -> None:
        if not received:
            received.append(signum)
            raise KeyboardInterrupt

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def cmd_plan(args: argparse.Namespace) -> int:
    from fedlm import cli_plan

    return cli_plan.run(args)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from fedlm import dashboard

    from fedlm import store

    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port: must be in [1, 65535], got {args.port}")
    app = Path(dashboard.__file__).resolve().parent / "app.py"
    db = str(Path(args.db or Config().db).resolve())
    if Path(db).exists():  # a missing one is fine: the page waits for a run to create it
        store.list_runs(db)
    else:  # ... unless it can never be made
        folder = next(f for f in Path(db).parents if f.exists())
        if not folder.is_dir():
            raise StoreError(f"db: no run database can be made at {args.db or Config().db}: "
                             f"{folder} is a file, not a folder")
    print(f"fedlm dashboard on http://{args.host}:{args.port} reading {db} (Ctrl-C stops it)",
          flush=True)
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless=true",
           f"--server.port={args.port}", f"--server.address={args.host}",
           "--browser.gatherUsageStats=false", "--", "--db", db]
    return _serve(cmd)


def _serve(cmd: list[str], grace: float = 10.0) -> int:
    """Run the server ``cmd`` until it ends or we are told to stop (Ctrl-C, SIGTERM,
    SIGHUP); then stop it and everything it started (its own process group:
    SIGTERM, SIGKILL after ``grace`` seconds), so nothing outlives the command."""
    import subprocess

    stopping = threading.Event()

    def on_signal(signum, frame) -> None:
        if not stopping.is_set():  # once: a second signal must not cut the stop short
            stopping.set()
            raise KeyboardInterrupt

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in signals}
    proc = subprocess.Popen(cmd, start_new_session=True)  # a group of its own to end
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if proc.poll() is None or stopping.is_set():
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            try:  # whatever of its group is left once it has gone
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for s, handler in previous.items():
            signal.signal(s, handler)


def _refuse(message: object) -> int:
    print(f"fedlm: error: {_one_line(message)}", file=sys.stderr)
    return 2


COMMANDS = {"run": cmd_run, "dashboard": cmd_dashboard, "sweep": cmd_sweep, "deploy": cmd_deploy, "runs": cmd_runs, "show": cmd_show, "export": cmd_export,
            "config": cmd_config, "replay": cmd_replay, "strategies": cmd_strategies,
            "plan": cmd_plan}


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:  # what is still buffered fails here, not in the interpreter's exit
            if sys.stdout is not None and not sys.stdout.closed:
                sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_gone()


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        return _refuse(exc)
    except (KeyError, StoreError) as exc:
        return _refuse(exc.args[0] if exc.args else exc)
    except BrokenPipeError:
        return _stdout_gone()
    except (OSError, sqlite3.Error) as exc:  # a path or database the command cannot use
        if os.environ.get("FEDLM_DEBUG"):
            raise
        from fedlm import store

        if isinstance(exc, OSError) and not exc.filename and len(exc.args) == 1:
            return _refuse(exc.args[0])  # e.g. the store's "no run database at PATH"
        if isinstance(exc, sqlite3.Error):
            return _refuse(store.db_error(getattr(args, "db", None) or Config().db, exc))
        return _refuse(f"{exc.filename}: {exc.strerror or exc}")
    except Exception as exc:
        # fedlm.replay (torch) is imported only by the commands that need it, so
        # that `fedlm runs`, `show` and usage errors answer at once
        replay = sys.modules.get("fedlm.replay")
        if replay is not None and isinstance(exc, replay.ReplayError):
            return _refuse(exc.args[0] if exc.args else exc)
        raise
    except KeyboardInterrupt:
        print("fedlm: interrupted", file=sys.stderr)
        return 130


def _stdout_gone() -> int:
    """The reader of our output went away (``fedlm runs | head -1``): stop quietly,
    as other Unix tools do, with SIGPIPE's status. Output still buffered would fail
    again at exit, so stdout now points at /dev/null (and stderr too when it is the
    same pipe: ``fedlm runs 2>&1 | head -1``)."""
    def same_pipe(fd: int) -> bool:
        try:
            a, b = os.fstat(fd), os.fstat(1)
        except OSError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    gone = [1, 2] if same_pipe(2) else [1]
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in gone:
        os.dup2(devnull, fd)
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
