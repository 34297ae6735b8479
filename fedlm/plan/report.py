"""What ``fedlm plan`` prints: the text table and the JSON, for any topology.

``human`` and ``seconds`` format numbers; ``describe`` says in one paragraph
what was planned, ``what`` the topology and streaming; ``table`` sets sync beside
async with the crossovers: a plain star (no streaming) its rows per job and a line
of bytes, anything else the exchange's rows, the async column "n/a" where there is
no async variant (ring, tree, streaming: JSON null); ``report_dict`` is everything
``--json`` prints (inf and nan as null).
"""

from __future__ import annotations

import math
from dataclasses import asdict

from fedlm.plan.inputs import PlanInput
from fedlm.plan.model import Prediction
from fedlm.plan.topology import is_plain, predict_topology, topology_crossovers

MODES = ("sync", "async")


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


def what(inp: PlanInput) -> str:
    """The topology and streaming, in words."""
    top = {"star": "star (parameter server)", "ring": "ring all-reduce, no server",
           "tree": "binary-tree all-reduce, no server",
           "hierarchical": "hierarchical (a star of pods)"}[inp.topology]
    if inp.fragments == 1 and inp.overlap == 0:
        return f"topology {top}"
    return (f"topology {top}; streamed in {inp.fragments} fragment(s) of "
            f"{human(inp.params / inp.fragments)} parameters, one every "
            f"{inp.H // inp.fragments} inner steps, overlapping {inp.overlap} step(s)")


def table(inp: PlanInput, preds: dict | None = None, modes=MODES,
          names: dict | None = None) -> str:
    """The plan as text, sync beside async, with the crossovers. ``preds``:
    ``predict_topology(inp)``; ``names``: a column's strategies, if not the usual."""
    preds = preds or predict_topology(inp)
    s, a = preds["sync"], preds["async"]
    na = "n/a"
    if s is None:  # async only (two-level: fedlm.plan.regions): no exchange, no crossovers
        modes = ("async",)
    if is_plain(inp) or s is None:  # per job: the parameter server's view
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
        head = describe(inp)
    else:  # per outer step of P segments: the exchange's view
        def sync_only(fmt):
            return lambda p: fmt(p) if p is s else na

        rows = [
            ("time per outer step", lambda p: seconds(p.time_per_update)),
            ("outer steps per hour", lambda p: f"{p.updates_per_hour:,.1f}"),
            ("compute utilisation", lambda p: f"{p.compute_utilisation:.1%}"),
            ("communication fraction (exposed)", lambda p: f"{p.comm_fraction:.1%}"),
            ("idle fraction", lambda p: f"{p.idle_fraction:.1%}"),
            ("compute per outer step", lambda p: seconds(p.compute)),
            ("communication exposed per outer step", sync_only(lambda p: seconds(p.exposed))),
            ("communication hidden per outer step", sync_only(lambda p: seconds(p.hidden))),
            ("one exchange (one fragment)", sync_only(lambda p: seconds(p.exchange_seconds))),
            ("bytes per site per outer step", sync_only(lambda p: human(p.bytes_per_site, "B"))),
            ("bytes in total per outer step", sync_only(lambda p: human(p.bytes_total, "B"))),
            ("bytes per site per exchange",
             sync_only(lambda p: human(p.bytes_per_exchange, "B"))),
            ("peak bandwidth per site",
             sync_only(lambda p: human(8 * p.peak_bandwidth, "bit/s"))),
        ]
        head = f"{describe(inp)}; {what(inp)}"
    width = max(len(r[0]) for r in rows)
    label = {"sync": ("sync", "(diloco,fedavg)"), "async": ("async", "(async-sgd,..)")}
    label.update({m: (m, f"({n})") for m, n in (names or {}).items()})
    lines = [head, "", f"{'':<{width}}" + "".join(f"  {label[m][0]:>14}" for m in modes),
             f"{'':<{width}}" + "".join(f"  {label[m][1]:>14}" for m in modes)]
    for name, fmt in rows:
        cells = [fmt(s) if m == "sync" else (fmt(a) if a is not None else na) for m in modes]
        lines.append(f"{name:<{width}}" + "".join(f"  {c:>14}" for c in cells))
    if s is None:  # no exchange, no crossovers
        return "\n".join(lines)
    crossing = [crossover_line(m, c) if c is not None else _no_crossover(inp, m)
                for m, c in topology_crossovers(inp).items() if m in modes]
    if is_plain(inp):
        footer = [*crossing, f"bytes per outer step: {human(s.bytes_per_site, 'B')} per site "
                             f"({s.site}); {human(s.bytes_total, 'B')} in total"]
    else:
        footer = [f"bytes per site: {s.site}; peak bandwidth: one exchange's bytes over "
                  + (f"the {inp.overlap} inner step(s) it may hide behind" if inp.overlap
                     else "the time it takes (no overlap: the link's own rate)"), "", *crossing]
    return "\n".join([*lines, "", *footer])


def _no_crossover(inp: PlanInput, mode: str) -> str:
    """The crossover line of a mode that has no variant here (synchronous only)."""
    why = ([f"a {inp.topology} all-reduce"] if inp.topology in ("ring", "tree") else []) \
        + (["streaming"] if inp.fragments > 1 or inp.overlap > 0 else [])
    return f"{mode:>5}: n/a ({' and '.join(why)}: synchronous only)"


def crossover_line(mode: str, c: dict) -> str:
    """The line under the table: where communication equals compute, where it is 10%
    of the busy time, and the bandwidth this model needs for 10%."""
    def size(x: float) -> str:
        if x == math.inf:
            return "never (below 1e16)"
        if x == 0:
            return "any size (above 1e3)"
        return f"{human(x)} parameters"

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


def report_dict(inp: PlanInput, preds: dict | None = None) -> dict:
    """Everything ``fedlm plan --json`` prints: the input, "sync" and "async" (null
    where there is no async variant), each with its exchange (bytes, exposed and
    hidden communication, peak bandwidth), and the crossovers (None where there is
    none: never, or at any size)."""
    preds = preds or predict_topology(inp)
    return jsonable({"input": input_dict(inp),
                     **{m: None if p is None else prediction_dict(p) for m, p in preds.items()},
                     "crossovers": None if preds["sync"] is None
                     else topology_crossovers(inp)})
