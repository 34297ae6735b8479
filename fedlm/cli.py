"""The ``fedlm`` command line.

    fedlm run [CONFIG.toml] [--set key=value ...] [--db PATH]   train, on Flower's simulation engine
    fedlm runs [--db PATH]                                      list stored runs
    fedlm show RUN_ID [--db PATH]                               a run's summary
    fedlm export RUN_ID [--db PATH] [--format csv|parquet]      a run's tables as files
    fedlm config [CONFIG.toml] [--set key=value ...]            print the resolved config
    fedlm replay RUN_ID [--db PATH]                             re-execute a run from its log
    fedlm strategies                                            list strategies and policies
    fedlm dashboard [--db PATH] [--port N]                      the live Streamlit dashboard
    fedlm sweep SPEC.toml [--quick] [--backend B]               strategies x profiles, one report
    fedlm deploy local --workers N [CONFIG] [--set ...]         SuperLink + SuperNodes on loopback

Bad input ends with one line, ``fedlm: error: FIELD: ...``, and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from fedlm import config as config_lib
from fedlm.config import Config, ConfigError
from fedlm.replay import ReplayError
from fedlm.store import StoreError


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="TOML config file (default: the embedded default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set strategy=fedavg --set inner.lr=1e-3")


def _add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, help="run database (default: the config's db, "
                   "runs/fedlm.db)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedlm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a simulation on Flower's simulation engine")
    _add_config_args(p)
    _add_db_arg(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--backend", choices=("flower", "inprocess"), default="flower",
                   help="flower: Flower's simulation engine (Ray actors, the default); "
                        "inprocess: every job in this process, no Ray (debugging, sweeps)")

    p = sub.add_parser("runs", help="list stored runs")
    _add_db_arg(p)

    p = sub.add_parser("show", help="summary of one run")
    p.add_argument("run_id", type=int)
    _add_db_arg(p)

    p = sub.add_parser("export", help="write a run's tables as CSV or Parquet")
    p.add_argument("run_id", type=int)
    _add_db_arg(p)
    p.add_argument("--format", choices=("csv", "parquet"), default="csv")
    p.add_argument("--out", default="runs/export", help="output folder (default: runs/export)")

    p = sub.add_parser("config", help="print the resolved config as TOML")
    _add_config_args(p)

    p = sub.add_parser("replay", help="re-execute a run from its operation log and compare "
                       "the final weights' hash")
    p.add_argument("run_id", type=int)
    _add_db_arg(p)

    sub.add_parser("strategies", help="list the available strategies and local-steps policies")

    p = sub.add_parser("sweep", help="run strategies x heterogeneity profiles and write a "
                       "report with tables and plots")
    p.add_argument("spec", help="sweep spec, e.g. experiments/configs/paper.toml")
    p.add_argument("--quick", action="store_true", help="the spec's reduced [quick] version")
    p.add_argument("--backend", choices=("flower", "inprocess"), default="flower")
    p.add_argument("--rerun", action="store_true", help="ignore finished runs of the same name")
    p.add_argument("--db", default=None, help="override the spec's run database")
    p.add_argument("--out", default=None, help="override the spec's report path")

    p = sub.add_parser("deploy", help="run on Flower's deployment engine (SuperLink + "
                       "SuperNodes) on this machine")
    p.add_argument("where", choices=("local",), help="local: every process on 127.0.0.1")
    p.add_argument("--workers", type=int, default=None, help="SuperNodes (default: config's)")
    _add_config_args(p)
    _add_db_arg(p)
    p.add_argument("--home", default="runs/deploy", help="FLWR_HOME and logs (default: "
                   "runs/deploy)")

    p = sub.add_parser("dashboard", help="serve the live dashboard (Streamlit)")
    _add_db_arg(p)
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default: loopback)")
    return parser


# ---------------------------------------------------------------------------

def _quiet_libraries() -> None:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("TQDM_DISABLE", "")  # leave tqdm on for our bar
    import datasets
    import flwr.simulation  # noqa: F401  (configures flwr's logger; quiet it after)

    # ERROR: hides run_simulation's deprecation notice (we use it on purpose: it runs
    # in-process and leaves no daemon behind; see docs/architecture.md).
    logging.getLogger("flwr").setLevel(logging.ERROR)

    datasets.disable_progress_bars()


def backend_config(cfg: Config) -> dict:
    """Ray resources: ``actors`` ClientApp actors sharing ``cpus`` (fractions allowed)."""
    from fedlm.model import resolve_device

    cpus = cfg.sim.cpus or (os.cpu_count() or 1)
    actors = cfg.sim.actors or min(cfg.workers, 2 * cpus)
    gpus = 1.0 / actors if resolve_device(cfg.device) == "cuda" else 0.0
    return {"client_resources": {"num_cpus": cpus / actors, "num_gpus": gpus},
            "init_args": {"num_cpus": cpus, "num_gpus": 1 if gpus else 0,
                          "logging_level": "ERROR", "log_to_driver": True,
                          "include_dashboard": False}}


def cmd_run(args: argparse.Namespace) -> int:
    cfg = config_lib.load(args.config, args.overrides)
    db = args.db or cfg.db
    by_steps = cfg.local_step_budget > 0
    _quiet_libraries()
    from flwr.simulation import run_simulation
    from tqdm import tqdm

    from fedlm import data
    from fedlm.client_app import app as client_app
    from fedlm.engine import Progress
    from fedlm.runner import run_inprocess
    from fedlm.server_app import make_server_app

    stop = f"{cfg.updates} updates" + (f" or {cfg.local_step_budget} local steps"
                                       if by_steps else "")
    print(f"fedlm: {cfg.workers} workers, {cfg.fleet.preset} profile, {cfg.model} model, "
          f"{cfg.strategy} ({cfg.local_steps} local steps, H={cfg.inner.steps}), "
          f"{stop} -> {db}", flush=True)
    data.load_corpus(cfg.data)  # tokenize once here, not in every Ray actor at once
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

    # Ctrl-C / SIGTERM: ask the engine to stop; the ServerApp then returns and
    # run_simulation shuts Ray down, so no actor outlives the command.
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        if not stop.is_set():
            print("\nfedlm: stopping (the run is kept, marked interrupted)...", file=sys.stderr,
                  flush=True)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    server = make_server_app(cfg, db, on_progress, on_start=lambda rid: started.update(id=rid),
                             should_stop=stop.is_set)
    try:
        if args.backend == "inprocess":
            run_inprocess(cfg, db, progress=on_progress,
                          on_start=lambda rid: started.update(id=rid), should_stop=stop.is_set)
        else:
            run_simulation(server_app=server, client_app=client_app,
                           num_supernodes=cfg.workers, backend_config=backend_config(cfg))
    except Exception:  # re-raised from the ServerApp thread; the store has the reason
        if "id" not in started or os.environ.get("FEDLM_DEBUG"):
            raise
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
        with store.connect_readonly(db) as conn:
            err = conn.execute("SELECT error FROM runs WHERE id=?", (run_id,)).fetchone()[0]
        print(f"fedlm: run {run_id} {s.status}: {err or 'still running'}", file=sys.stderr)
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
    print(f"  stored in {db} (run {s.run_id}); `fedlm show {s.run_id} --db {db}`")
    return 0


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

    for path in store.export(args.db or Config().db, args.run_id, args.out, args.format):
        print(path)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    import tomli_w

    cfg = config_lib.load(args.config, args.overrides)
    print(tomli_w.dumps(cfg.to_dict()), end="")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fedlm.replay import describe, replay

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
    from strategies.registry import describe

    for name, kind, line in describe():
        print(f"{name:<18} {kind:<12} {line}")
    print("\nplug in your own: --set strategy=package.module:Class, or an entry point in the "
          "'fedlm.strategies' group (docs/strategies.md)")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedlm import sweep

    spec = sweep.load_spec(args.spec, args.quick)
    if args.db:
        spec["db"] = args.db
    if args.out:
        spec["out"] = args.out
    cells = sweep.run_sweep(spec, backend=args.backend, rerun=args.rerun)
    out = Path(spec["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    pngs = sweep.plot(spec, cells, out.with_suffix(""))
    text = sweep.report(spec, cells)
    text += "\n## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n"
    out.write_text(text)
    print(text)
    print(f"wrote {out}, {', '.join(str(p) for p in pngs)}")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from fedlm import deploy

    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"workers={args.workers}")
    cfg = config_lib.load(args.config, overrides)
    db = args.db or cfg.db
    status = deploy.main_local(cfg, overrides, db, Path(args.home).resolve(), args.config)
    if status != 0:
        print(f"fedlm: error: flwr run exited with {status}; logs in {args.home}",
              file=sys.stderr)
        return 1
    from fedlm import store

    return _print_summary(db, max(r["id"] for r in store.list_runs(db)))


def cmd_dashboard(args: argparse.Namespace) -> int:
    import subprocess

    import dashboard

    app = Path(dashboard.__file__).resolve().parent / "app.py"
    db = str(Path(args.db or Config().db).resolve())
    print(f"fedlm dashboard on http://{args.host}:{args.port} reading {db} (Ctrl-C stops it)",
          flush=True)
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless=true",
           f"--server.port={args.port}", f"--server.address={args.host}",
           "--browser.gatherUsageStats=false", "--", "--db", db]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0


COMMANDS = {"run": cmd_run, "dashboard": cmd_dashboard, "sweep": cmd_sweep, "deploy": cmd_deploy, "runs": cmd_runs, "show": cmd_show, "export": cmd_export,
            "config": cmd_config, "replay": cmd_replay, "strategies": cmd_strategies}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"fedlm: error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, KeyError, StoreError, ReplayError) as exc:
        msg = exc.args[0] if exc.args else str(exc)
        print(f"fedlm: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedlm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
