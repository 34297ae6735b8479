"""``fedlm trace``: write seeded FedScale-format traces, or summarise one.

    fedlm trace device --clients N --seed S --out PATH [--format json|pickle]
    fedlm trace availability --clients N --seed S --out PATH [--period SECONDS] [--format ...]
    fedlm trace show PATH

The files are FedScale's own format (``fedlm.sim.traces``, docs/traces.md): a run reads
them through ``fleet.device_trace`` and ``fleet.availability_trace``, and FedScale reads
the pickles. Without --format, a path ending in .pkl, .pickle or .p is a pickle and any
other JSON. Imports numpy only when the command runs.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path


def cmd_trace(args: argparse.Namespace) -> int:
    from fedlm.sim import traces

    if args.action == "show":
        kind, entries = traces.load_trace(args.path)
        for line in (_device_lines if kind == "device" else _availability_lines)(entries):
            print(line)
        return 0
    fmt = args.format or ("pickle" if Path(args.out).suffix.lower() in (".pkl", ".pickle", ".p")
                          else "json")
    if args.action == "device":
        data = traces.generate_device(args.clients, args.seed)
    else:
        data = traces.generate_availability(args.clients, args.seed, args.period)
    traces.write_trace(args.out, data, fmt)
    _, entries = traces.load_trace(args.out)  # as a run will read it
    print(f"wrote {args.out} ({fmt}): {_headline(args.action, entries)}")
    return 0


def _headline(kind: str, entries: list) -> str:
    """One line: the clients and the trace's mean values."""
    n = len(entries)
    if kind == "device":
        comp = statistics.fmean(e.computation for e in entries)
        comm = statistics.fmean(e.communication for e in entries)
        return (f"device trace of {n} clients, computation mean {comp:.1f} ms/sample, "
                f"communication mean {comm:,.0f} kbit/s")
    period = entries[0].finish_time
    frac = statistics.fmean(_active_fraction(e) for e in entries)
    per_day = statistics.fmean(len(e.windows()) for e in entries) / (period / 86400.0)
    return (f"availability trace of {n} clients over {period:,.0f} s "
            f"({period / 86400.0:.2g} days), mean active fraction {frac:.3f}, "
            f"mean {per_day:.2f} windows per client per day")


def _active_fraction(e) -> float:
    return sum(b - a for a, b in e.windows()) / e.finish_time


def _spread(values: list[float], unit: str = "", fmt: str = ",.1f") -> str:
    unit = f" {unit}" if unit else ""
    return (f"{min(values):{fmt}} - {max(values):{fmt}}{unit} "
            f"(median {statistics.median(values):{fmt}}, mean {statistics.fmean(values):{fmt}})")


def _device_lines(entries: list) -> list[str]:
    comp = [e.computation for e in entries]
    comm = [e.communication for e in entries]
    return [f"device trace: {len(entries)} clients",
            f"  computation    {_spread(comp, 'ms/sample')}",
            f"  communication  {_spread(comm, 'kbit/s', ',.0f')}",
            "  (a worker's inner step: 3.0 x batch x computation / 1000 s; its link: "
            "communication x 1024 / 8 bytes/s both ways)"]


def _availability_lines(entries: list) -> list[str]:
    periods = sorted({e.finish_time for e in entries})
    frac = [_active_fraction(e) for e in entries]
    wins = [float(len(e.windows())) for e in entries]
    never = sum(1 for e in entries if not e.windows())
    always = sum(1 for e in entries if e.windows() == [(0.0, e.finish_time)])
    shown = ", ".join(f"{p:,.0f}" for p in periods[:3]) + (", ..." if len(periods) > 3 else "")
    return [f"availability trace: {len(entries)} clients, finish_time {shown} s "
            f"({periods[0] / 86400.0:.2g}{'+' if len(periods) > 1 else ''} days)",
            f"  active fraction      {_spread(frac, fmt='.3f')}",
            f"  windows per client   {_spread(wins)}",
            f"  never active: {never} clients, always active: {always}"]
