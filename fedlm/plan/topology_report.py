"""What ``fedlm plan`` prints for a topology or a streamed exchange: the table and the JSON.

A plain star (``--topology star``, no streaming) prints today's table
(``fedlm.plan.report.table``) and two lines of bytes under it. Anything else
prints the rows a ``TopologyPlan`` has, sync beside async, the async column
"n/a" where there is no async variant (ring, tree, streaming: JSON null).
"""

from __future__ import annotations


from fedlm.plan.inputs import PlanInput
from fedlm.plan.report import (crossover_line, describe, human, input_dict, jsonable,
                               prediction_dict, seconds)
from fedlm.plan.report import table as star_table
from fedlm.plan.topology import (TopologyPlan, has_async, is_plain, plan_dict,
                                 predict_topology, topology_crossovers)

MODES = ("sync", "async")


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


def _bytes_lines(tp: TopologyPlan) -> list[str]:
    return [f"bytes per outer step: {human(tp.bytes_per_site, 'B')} per site ({tp.site}); "
            f"{human(tp.bytes_total, 'B')} in total"]


def table(inp: PlanInput, out: dict | None = None, modes=MODES) -> str:
    """The plan as text. ``out``: ``predict_topology(inp)``."""
    out = out or predict_topology(inp)
    tp: TopologyPlan = out["sync"]
    if is_plain(inp) and tuple(modes) == MODES:
        pred = {"sync": out["prediction"], "async": out["async"]}
        return "\n".join([star_table(inp, pred), *_bytes_lines(tp)])
    na = "n/a"
    a = out["async"]

    def col(mode: str, sync_text, async_text) -> str:
        if mode == "sync":
            return sync_text
        return async_text if a is not None else na

    rows = [
        ("time per outer step", lambda m: col(m, seconds(tp.time_per_outer_step),
                                              a and seconds(a.time_per_update))),
        ("outer steps per hour", lambda m: col(m, f"{tp.updates_per_hour:,.1f}",
                                               a and f"{a.updates_per_hour:,.1f}")),
        ("compute utilisation", lambda m: col(m, f"{tp.compute_utilisation:.1%}",
                                              a and f"{a.compute_utilisation:.1%}")),
        ("communication fraction (exposed)", lambda m: col(m, f"{tp.comm_fraction:.1%}",
                                                           a and f"{a.comm_fraction:.1%}")),
        ("idle fraction", lambda m: col(m, f"{tp.idle_fraction:.1%}",
                                        a and f"{a.idle_fraction:.1%}")),
        ("compute per outer step", lambda m: col(m, seconds(tp.compute), a and seconds(a.compute))),
        ("communication exposed per outer step", lambda m: col(m, seconds(tp.exposed), na)),
        ("communication hidden per outer step", lambda m: col(m, seconds(tp.hidden), na)),
        ("one exchange (one fragment)", lambda m: col(m, seconds(tp.exchange_seconds), na)),
        ("bytes per site per outer step", lambda m: col(m, human(tp.bytes_per_site, "B"), na)),
        ("bytes in total per outer step", lambda m: col(m, human(tp.bytes_total, "B"), na)),
        ("bytes per site per exchange", lambda m: col(m, human(tp.bytes_per_exchange, "B"), na)),
        ("peak bandwidth per site", lambda m: col(m, human(8 * tp.peak_bandwidth, "bit/s"),
                                                  na)),
    ]
    width = max(len(r[0]) for r in rows)
    head = {"sync": ("sync", "(diloco,fedavg)"), "async": ("async", "(async-sgd,..)")}
    lines = [f"{describe(inp)}; {what(inp)}", "",
             f"{'':<{width}}" + "".join(f"  {head[m][0]:>14}" for m in modes),
             f"{'':<{width}}" + "".join(f"  {head[m][1]:>14}" for m in modes)]
    for label, fmt in rows:
        lines.append(f"{label:<{width}}" + "".join(f"  {fmt(m):>14}" for m in modes))
    lines += ["", f"bytes per site: {tp.site}; peak bandwidth: one exchange's bytes over "
              + (f"the {inp.overlap} inner step(s) it may hide behind" if inp.overlap
                 else "the time it takes (no overlap: the link's own rate)"), ""]

    for mode, c in topology_crossovers(inp).items():
        if mode not in modes:
            continue
        if c is None:
            why = ([f"a {inp.topology} all-reduce"] if inp.topology in ("ring", "tree") else []) \
                + (["streaming"] if inp.fragments > 1 or inp.overlap > 0 else [])
            lines.append(f"{mode:>5}: n/a ({' and '.join(why)}: synchronous only)")
            continue
        lines.append(crossover_line(mode, c))
    return "\n".join(lines)


def report_dict(inp: PlanInput, out: dict | None = None) -> dict:
    """``fedlm plan --json``: the input, "sync" and "async" (null where there is no
    async variant), "topology" (bytes, exposed / hidden communication, peak
    bandwidth) and the crossovers. A plain star's "sync" is today's prediction."""
    out = out or predict_topology(inp)
    tp = out["sync"]
    sync = prediction_dict(out["prediction"]) if "prediction" in out else {
        "mode": "sync", "time_per_update": tp.time_per_outer_step,
        "time_per_round": tp.time_per_outer_step,
        "compute_utilisation": tp.compute_utilisation, "comm_fraction": tp.comm_fraction,
        "idle_fraction": tp.idle_fraction, "compute": tp.compute,
        "updates_per_hour": tp.updates_per_hour}
    return jsonable({"input": input_dict(inp), "sync": sync,
                     "async": prediction_dict(out["async"]) if has_async(inp) else None,
                     "topology": plan_dict(tp), "crossovers": topology_crossovers(inp)})
