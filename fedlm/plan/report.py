"""What ``fedlm plan`` prints: the text table and the JSON.

``human`` and ``seconds`` format numbers; ``describe`` says in one paragraph
what was planned; ``table`` sets sync beside async with the crossovers;
``report_dict`` is everything ``--json`` prints (inf and nan as null).
"""

from __future__ import annotations

import math
from dataclasses import asdict

from fedlm.plan.crossovers import crossovers
from fedlm.plan.inputs import PlanInput
from fedlm.plan.model import Prediction, predict


# ---------------------------------------------------------------------------
# The text
# ---------------------------------------------------------------------------

def human(x: float, unit: str = "", base: float = 1000.0) -> str:
    """1.5e9 -> '1.5 G' (+unit)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g} {unit}".strip()
    prefixes = ["", "k", "M", "G", "T", "P", "E"]
    k = max(0, min(len(prefixes) - 1, math.floor(math.log(abs(x), base))))
    return f"{x / base ** k:.3g} {prefixes[k]}{unit}".strip()


def seconds(x: float) -> str:
    if not math.isfinite(x):
        return "inf"
    if x < 1e-3:
        return f"{x * 1e6:.3g} µs"
    if x < 1:
        return f"{x * 1e3:.3g} ms"
    if x < 120:
        return f"{x:.3g} s"
    if x < 7200:
        return f"{x / 60:.3g} min"
    if x < 172800:
        return f"{x / 3600:.3g} h"
    return f"{x / 86400:.3g} d"


def describe(inp: PlanInput) -> str:
    """One paragraph of what was planned."""
    def vals(name, fmt):
        v = sorted(set(getattr(inp, name)))
        if len(v) > 4:
            return f"{fmt(v[0])}..{fmt(v[-1])}"
        return "/".join(fmt(x) for x in v)

    link = (f"links {vals('down_bw', lambda b: human(8 * b, 'bit/s'))} down, "
            f"{vals('up_bw', lambda b: human(8 * b, 'bit/s'))} up, "
            f"latency {vals('latency', seconds)}")
    server = ("server link unlimited" if not (inp.server_down or inp.server_up) else
              f"server link {human(8 * inp.server_down, 'bit/s') if inp.server_down else 'unlimited'}"
              f" down, {human(8 * inp.server_up, 'bit/s') if inp.server_up else 'unlimited'} up")
    per_dc = vals("workers_per_dc", str)
    pods = (f" as one pod each (all-reduce at {human(8 * inp.intra_bw, 'bit/s')})"
            if inp.hierarchical else "")
    return (f"{human(inp.params)} parameters, {inp.data_centres} data centre(s) x "
            f"{per_dc} worker(s){pods}, H = {inp.H} steps of "
            f"{vals('step_time', seconds)}, {link}; {server}; upload "
            f"{inp.compression} ({human(inp.up_bytes(), 'B')}), download {inp.down_compression} "
            f"({human(inp.down_bytes(), 'B')})"
            + (f", jitter {inp.jitter:g}" if inp.jitter else "")
            + (f", daily bandwidth dip {inp.daily_amplitude:.0%}" if inp.daily_amplitude else ""))


def table(inp: PlanInput, preds: dict[str, Prediction] | None = None) -> str:
    """The plan as a text table, sync beside async, with the crossovers."""
    preds = preds or predict(inp)
    rows = [
        ("time per outer step (sync: round; async: arrival)",
         lambda p: seconds(p.time_per_update)),
        (f"time for N = {inp.nodes} updates", lambda p: seconds(p.time_per_round)),
        ("outer steps per hour", lambda p: f"{p.updates_per_hour:,.1f}"),
        ("compute utilisation", lambda p: f"{p.compute_utilisation:.1%}"),
        ("communication fraction", lambda p: f"{p.comm_fraction:.1%}"),
        ("idle fraction", lambda p: f"{p.idle_fraction:.1%}"),
        ("download per job", lambda p: seconds(p.download)),
        ("compute per job", lambda p: seconds(p.compute)),
        ("upload per job", lambda p: seconds(p.upload)),
    ]
    if inp.server_down or inp.server_up:
        rows.append(("transfers sharing the server (down/up)",
                     lambda p: f"{p.crowd_down:.1f} / {p.crowd_up:.1f}"))
    width = max(len(r[0]) for r in rows)
    lines = [describe(inp), "",
             f"{'':<{width}}  {'sync':>14}  {'async':>14}",
             f"{'':<{width}}  {'(diloco,fedavg)':>14}  {'(async-sgd,..)':>14}"]
    for label, fmt in rows:
        lines.append(f"{label:<{width}}  {fmt(preds['sync']):>14}  {fmt(preds['async']):>14}")
    lines.append("")

    for mode, c in crossovers(inp).items():
        lines.append(crossover_line(mode, c))
    return "\n".join(lines)


def crossover_line(mode: str, c: dict) -> str:
    """The line under the table: where communication equals compute, where it is 10%
    of the busy time, and the bandwidth this model needs for 10%."""
    def size(x: float) -> str:
        return ("never (below 1e16)" if x == math.inf else "any size (above 1e3)" if x == 0
                else f"{human(x)} parameters")

    bw = c["bandwidth_10pct"]
    need = ("no bandwidth is enough" if bw == math.inf else
            f"needs >= {human(8 * bw, 'bit/s')} on its slowest link")
    return (f"{mode:>5}: communication = compute at {size(c['params_equal'])}; "
            f"<= 10% of busy time up to {size(c['params_10pct'])}; this model "
            f"{need} for <= 10%")


# ---------------------------------------------------------------------------
# The JSON
# ---------------------------------------------------------------------------

def input_dict(inp: PlanInput) -> dict:
    """The input's fields, with the workers in all and the bytes each way."""
    d = asdict(inp)
    return {**d, "workers": inp.workers, "down_bytes": inp.down_bytes(),
            "up_bytes": inp.up_bytes()}


def prediction_dict(p: Prediction) -> dict:
    """A prediction's fields, with outer steps per hour."""
    return {**asdict(p), "updates_per_hour": p.updates_per_hour}


def jsonable(value):
    """``value`` with inf/nan as None (JSON has neither) and tuples as lists."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def report_dict(inp: PlanInput, preds: dict[str, Prediction] | None = None) -> dict:
    """Everything ``fedlm plan --json`` prints: the input, both predictions and
    the crossovers (None where there is none: never, or at any size)."""
    preds = preds or predict(inp)
    return jsonable({"input": input_dict(inp),
                     **{m: prediction_dict(p) for m, p in preds.items()},
                     "crossovers": crossovers(inp)})
