"""``fedlm sweep``: run a sweep spec's arms x profiles x seeds, then print its report and
what failed. The spec is read and checked by ``fedlm.sweep.spec.load_spec``, the runs
are ``fedlm.sweep.run``'s, the report ``fedlm.sweep.report``'s; this module applies --db,
--out, --seeds and --arms and chooses the exit status (1 if a cell failed or diverged, 130 if the
sweep was stopped; --report-only runs nothing and exits 0 with the report of what finished).
"""

from __future__ import annotations

import argparse
import sys

from fedlm.cli.parser import one_line
from fedlm.errors import ConfigError
from fedlm.store import check_writable


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedlm.sweep import report as sweep_report, run as sweep, spec as sweep_spec

    sweep.check_jobs(args.jobs, args.backend)  # before the spec is read or a run starts
    spec = sweep_spec.load_spec(args.spec, args.quick, seeds=args.seeds)
    if args.arms:
        total = len(spec["arm"])
        spec = sweep_spec.only_arms(spec, args.arms)
        print(f"fedlm: --arms: {len(spec['arm'])} of {total} arms (with the arms they are "
              f"compared with): {'; '.join(a['label'] for a in spec['arm'])}", file=sys.stderr)
    if args.db:
        spec["db"] = args.db
    if args.out:
        spec["out"] = args.out
    if args.report_only and args.rerun:
        raise ConfigError("--report-only runs nothing; --rerun would ignore every finished "
                          "run: use one of them")
    from fedlm.track import check_installed

    check_installed(args.track)  # a tracker not installed: refused in one line,
    check_writable(spec["db"])  # before anything is written at the spec's db
    try:
        result = sweep.run_sweep(spec, backend=args.backend, rerun=args.rerun, jobs=args.jobs,
                                 fail_fast=args.fail_fast, report_only=args.report_only,
                                 track=args.track)
    except (KeyboardInterrupt, sweep.SweepStopped):
        print("fedlm: sweep stopped; its runs are kept (interrupted ones marked so)",
              file=sys.stderr)
        return 130
    cells, failures = result.cells, result.failures
    total = len(sweep_spec.cells_of(spec))  # arms limited to some profiles, and seeds, counted
    if cells:
        text, written = sweep_report.write_report(spec, result)
        print(text)
        print(f"wrote {', '.join(str(p) for p in written)}")
    if result.not_run:
        print(f"fedlm: report of {len(cells)} of {total} cells; "
              f"{len(result.not_run)} not run (--report-only)", file=sys.stderr)
    for f in failures:
        print(f"fedlm: error: sweep cell {f.name} {f.status}: {one_line(f.reason)}",
              file=sys.stderr)
    diverged = sum(f.status == "diverged" for f in failures)
    if failures or result.stopped:
        print(f"fedlm: {len(cells)} of {total} cells finished, {len(failures) - diverged} "
              f"failed" + (f", {diverged} diverged" if diverged else "")
              + (" (stopped at the first failure: --fail-fast)" if result.stopped else ""),
              file=sys.stderr)
        return 1
    return 0
