"""The commands that read the run store and print it: ``fedlm runs`` (the list),
``show`` (one run's summary, also printed at the end of ``run`` and ``deploy``),
``export`` (a run's tables as files), ``config`` (the resolved config as TOML) and
``strategies`` (what ``strategy=`` takes).

Every read goes through ``fedlm.store``'s functions; this module only lays out
what they return.
"""

from __future__ import annotations

import argparse
import sys

from fedlm import store
from fedlm.config import Config

# Exit statuses of `fedlm run` / `show` / `deploy` by how the run ended (anything else
# that did not finish: 1; bad input: 2, fedlm.cli).
EXIT_STATUS = {"finished": 0, "diverged": 3, "interrupted": 130}


def print_summary(db: str, run_id: int) -> int:
    """Print run ``run_id``'s summary, or why it did not finish (one line on stderr).
    Returns the exit status that says so (``EXIT_STATUS``): 0 finished, 3 diverged,
    130 interrupted, 1 otherwise."""
    s = store.summarize(db, run_id)
    if s.status != "finished":
        row = store.run_row(db, run_id)
        why = row["error"] or "still running"
        if s.status == "crashed":
            why = (f"its writer (pid {row['owner_pid']} on {row['owner_host']}) is gone, last "
                   f"seen {store.last_seen(row)}; `fedlm run --resume {run_id} --db {db}` "
                   f"continues it")
        print(f"fedlm: run {run_id} {s.status}: {why}", file=sys.stderr)
        return EXIT_STATUS.get(s.status, 1)
    first = f"{s.first_perplexity:.2f}" if s.first_perplexity else "-"
    final = f"{s.final_perplexity:.2f}" if s.final_perplexity else "-"
    print(f"\nrun {s.run_id} ({s.name}): {s.strategy}, {s.profile}, {s.model} model, "
          f"{s.tokenizer} tokenizer")
    print(f"  validation perplexity {first} -> {final} (best {s.best_perplexity:.2f})")
    row = store.run_row(db, run_id)
    start = row["start_hash"] or row["initial_hash"]
    if row["final_hash"] and row["final_hash"] == start:  # finished, but learnt nothing
        print(f"  note: the evaluated model never changed: its final weights are the ones it "
              f"started from ({s.updates} updates from {s.jobs} jobs reached none of it)")
    if s.final_bits_per_byte is not None:  # per byte: compares runs of any tokenizers
        print(f"  validation bits per byte {s.first_bits_per_byte:.3f} -> "
              f"{s.final_bits_per_byte:.3f} (best {s.best_bits_per_byte:.3f})")
    clock = "virtual time" if s.clock == "virtual" else "wall-clock time"
    print(f"  {s.updates} updates from {s.jobs} jobs, {s.local_steps:,} local steps, "
          f"{s.tokens:,} tokens; {clock} {s.virtual_time:.1f} s, real time {s.wall_time:.1f} s")
    hidden = any(w.hidden for w in s.workers)  # streaming: comm behind compute too
    left_out = sum(w.not_drawn for w in s.workers)  # sampled rounds: not drawn, not idle
    print(f"  {'worker':>6} {'s/step':>7} {'region':>6} {'jobs':>5} {'compute':>9} "
          f"{'comm':>8} {'idle':>9} {'idle %':>7}" + (f" {'hidden comm':>12}" if hidden else "")
          + (f" {'not drawn':>10}" if left_out else ""))
    for w in s.workers:
        print(f"  {w.worker:>6} {w.step_time:>7.2f} {w.region:>6} {w.jobs:>5} {w.compute:>9.1f} "
              f"{w.communication:>8.2f} {w.idle:>9.1f} {100 * w.idle_fraction:>6.1f}%"
              + (f" {w.hidden:>12.2f}" if hidden else "")
              + (f" {w.not_drawn:>10.1f}" if left_out else ""))
    print(f"  straggler idle fraction (all workers): {100 * s.idle_fraction:.1f}%"
          + (" (of present time: not-drawn time left out)" if left_out else ""))
    _print_yardstick(db, run_id, s.clock)
    if left_out:  # docs/sampling.md: not drawn is neither idle nor present time
        there = left_out + sum(w.compute + w.communication + w.idle for w in s.workers)
        print(f"  not drawn: {100 * left_out / there:.1f}% of the workers' time there "
              f"({left_out:,.1f} s free and left out of the round open: not idle, not in "
              f"present time)")
    _print_rounds(db, run_id)
    _print_regions(store.region_transfers(db, run_id))
    _print_troubles(store.troubles(db, run_id))
    _print_fleet_changes(store.fleet_changes(db, run_id))
    print(f"  stored in {db} (run {s.run_id}); `fedlm show {s.run_id} --db {db}`")
    return 0


def _print_yardstick(db: str, run_id: int, clock: str) -> None:
    """The run's time against the least its fleet needs for its steps (fedlm.sim.bound)."""
    from fedlm.store.yardstick import yardstick

    y = yardstick(db, run_id)
    if y.ratio is None or clock != "virtual":
        return
    print(f"  fleet's bound for its {y.steps:,} steps: {y.bound:.1f} s; this run took "
          f"{y.ratio:.2f}x that; goodput {100 * y.goodput:.1f}% (useful compute / present)")
    print(f"  present worker time: useful compute {100 * y.goodput:.1f}%, compute never "
          f"applied {100 * y.unapplied:.1f}%, communication {100 * y.communication:.1f}%, "
          f"idle {100 * y.idle:.1f}%")


def _print_rounds(db: str, run_id: int, shown: int = 8) -> None:
    """A sampled run's rounds: drawn, kept, dropped, cut, wasted (the first and last few)."""
    from fedlm.store.rounds import rounds

    rs = rounds(db, run_id)
    if not rs:
        return
    total = lambda f: sum(getattr(r, f) for r in rs)  # noqa: E731
    print(f"  sampled rounds: {len(rs)}; drawn {total('drawn')} jobs of "
          f"{sum(r.available for r in rs) / len(rs):.1f} workers available on average; "
          f"kept {total('kept')}, dropped after the round closed {total('dropped')}, cut "
          f"by the deadline {total('deadline')}, lost {total('lost')}, running at the end "
          f"{total('running')}; {total('wasted'):.1f} s of compute wasted")
    print(f"  {'round':>6} {'version':>8} {'avail':>6} {'drawn':>6} {'kept':>5} "
          f"{'dropped':>8} {'cut':>4} {'lost':>5} {'wasted s':>9}")
    picked = list(enumerate(rs))
    if len(picked) > shown:
        picked = picked[:shown // 2] + [(None, None)] + picked[-(shown // 2):]
    for k, r in picked:
        if r is None:
            print(f"  {'...':>6}")
            continue
        print(f"  {k:>6} {r.version:>8} {r.available:>6} {r.drawn:>6} {r.kept:>5} "
              f"{r.dropped:>8} {r.deadline:>4} {r.lost:>5} {r.wasted:>9.1f}")


def _print_regions(regions: list[dict]) -> None:
    """A run whose servers exchange messages (halos' region servers, a pipelined
    server's updates): each region's pushes up and models back."""
    if not regions:
        return
    print("  messages to and from the server, per region:")
    print(f"  {'region':>8} {'pushes':>7} {'staleness':>10} {'models back':>12} "
          f"{'sent MB':>9} {'got MB':>8}")
    for r in regions:
        print(f"  {r['region']:>8} {r['pushes']:>7} {r['push_staleness']:>10.2f} "
              f"{r['models']:>12} {r['bytes_up'] / 1e6:>9.1f} {r['bytes_down'] / 1e6:>8.1f}")


def _print_fleet_changes(changes: list) -> None:
    """A fleet that changed over time (``store.fleet_changes``), if it did."""
    if not changes:
        return
    print("  fleet changes over time:")
    print(f"  {'worker':>6} {'absent s':>9} {'absences':>9} {'slowed s':>9} {'stragglers':>11} "
          f"{'departed':>9} {'joined':>8} {'left':>8}")
    for c in changes:
        if c.never:
            joined = "never"
        elif c.joined is not None:
            joined = f"{c.joined:.1f}"
        else:
            joined = "start"
        left = f"{c.left:.1f}" if c.left is not None else "-"
        print(f"  {c.worker:>6} {c.absent:>9.1f} {c.absences:>9} {c.slowed:>9.1f} "
              f"{c.stragglers:>11} {c.departed:>9} {joined:>8} {left:>8}")
    never = [str(c.worker) for c in changes if c.never]
    if never:
        print(f"  note: worker{'s' if len(never) > 1 else ''} {', '.join(never)} never came "
              f"during the run (absent from start to end: with a trace, is "
              f"fleet.trace_time_scale too large for the run?)")


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
    db = args.db or Config().db
    rows = store.list_runs(db)
    if not rows:
        print(f"no runs in {db}")
        return 0
    # ppl is per token (compare it within a tokenizer); bits/B compares across them
    print(f"{'id':>4} {'status':>9} {'strategy':>16} {'profile':>11} {'model':>6} "
          f"{'workers':>7} {'updates':>7} {'virtual s':>10} {'tokenizer':>9} {'ppl':>8} "
          f"{'bits/B':>6}  name")
    for r in rows:
        if r["damaged"]:  # listed, with what is wrong: the others are read as ever
            print(f"{r['id']:>4} {'damaged':>9}  {r['damaged']}")
            continue
        ppl = f"{r['last_perplexity']:.2f}" if r["last_perplexity"] else "-"
        bpb = f"{r['last_bits_per_byte']:.3f}" if r["last_bits_per_byte"] else "-"
        vt = f"{r['virtual_time']:.1f}" if r["virtual_time"] is not None else "-"
        print(f"{r['id']:>4} {r['status']:>9} {r['strategy']:>16} {r['profile']:>11} "
              f"{r['model']:>6} {r['workers']:>7} {r['reached']:>7} {vt:>10} "
              f"{r['tokenizer']:>9} {ppl:>8} {bpb:>6}  {r['name']}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    return print_summary(args.db or Config().db, args.run_id)


def cmd_export(args: argparse.Namespace) -> int:
    from fedlm.store.damage import damage, refuse_damaged

    db = args.db or Config().db
    if store.run_row(db, args.run_id) is None:  # bad db, unknown run: no --out made
        raise KeyError(f"no run {args.run_id} in {db}")
    if args.track:
        refuse_damaged(db, args.run_id)  # a tracker gets numbers, or nothing
        from fedlm.track import export

        print(export(db, args.run_id, args.track, args.track_dir))
        return 0
    why = damage(db, args.run_id)
    if why and args.format != "csv":  # Parquet holds one type per column
        raise store.StoreError(f"run {args.run_id} in {db} is damaged: {why}; Parquet holds "
                               f"one type per column: --format csv writes its rows as stored")
    for path in store.export(db, args.run_id, args.out, args.format):
        print(path)
    if why:
        print(f"fedlm: note: run {args.run_id} is damaged ({why}); its rows are written as "
              f"stored", file=sys.stderr)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    import tomli_w

    from fedlm import config_load

    cfg = config_load.load(args.config, args.overrides)
    print(tomli_w.dumps(cfg.to_dict()), end="")
    return 0


def cmd_strategies(args: argparse.Namespace) -> int:
    from fedlm.strategies.registry import describe

    for name, kind, line, source in describe():
        print(f"{name:<18} {kind:<12} {line}")
        if source:
            print(f"{'':<31} {source}")
    examples = _example_sources()
    if examples:
        print("\nplug-ins in this checkout's examples/ (PYTHONPATH=examples, "
              "strategy=MODULE:CLASS):")
        for name, source in examples:
            print(f"{name:<30} {source}")
    print("\nplug in your own: --set strategy=package.module:Class, or an entry point in the "
          "'fedlm.strategies' group (docs/strategies.md)")
    return 0


def _example_sources() -> list[tuple[str, str]]:
    """(module, its SOURCE line) of each plug-in in a source checkout's examples/, read
    from the file's text (nothing of it runs); none from an installed package."""
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "examples"
    out = []
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        try:
            tree = ast.parse(path.read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] \
                    == ["SOURCE"] and isinstance(node.value, ast.Constant):
                out.append((path.stem, str(node.value.value)))
    return out
