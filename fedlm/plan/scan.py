"""``fedlm plan --scan``: model size x data centres x topology x streaming, in one table.

For every model size in ``SIZES`` (1B .. 100T) and number of data centres in
``DATA_CENTRES`` (2 .. 100), each topology in ``TOPOLOGIES`` whole and streamed:
bytes per site and in total per outer step, the time of an outer step, the
compute utilisation, and the bandwidth the slowest link needs for
communication to stay at or under 10% of the busy time (``topology_bandwidth``).

What is held, what varies:

- the plan as given (links, latency, H, compression, jitter, server link);
- the **step time scales with the model**: the step time given is that of
  ``--params``, and a model k times larger takes k times longer per step (the
  same tokens per step on the same FLOP/s: a step costs about 6 · P · tokens
  FLOPs). Holding it fixed instead would only say that bigger models move
  more bytes per second of compute;
- star, ring and tree: each data centre is one site (its internal training
  is inside the step time); hierarchical: each data centre is a pod of the
  input's workers per data centre (``--workers`` / ``--data-centres``), whose
  step time gains the pod's all-reduce over ``--intra-bandwidth``, talking to
  the server as one (with one worker per data centre it is the star);
- streamed: the input's ``--fragments`` / ``--overlap`` if given, else
  ``STREAM`` (P = 4 fragments, τ = min(5, H/P − 1) inner steps of overlap).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from fedlm.plan.inputs import PlanInput
from fedlm.plan.report import human, jsonable, seconds
from fedlm.plan.topology import plan_topology, topology_bandwidth

SIZES = (1e9, 1e10, 1e11, 1e12, 1e13, 1e14)
DATA_CENTRES = (2, 5, 10, 20, 50, 100)
TOPOLOGIES = ("star", "ring", "tree", "hierarchical")
STREAM = 4  # fragments when the input streams nothing (overlap: min(5, H/P - 1))


def streamed(inp: PlanInput) -> tuple[int, int]:
    """(P, τ) of the streamed variant."""
    if inp.fragments > 1 or inp.overlap > 0:
        return inp.fragments, inp.overlap
    p = STREAM if inp.H % STREAM == 0 else 1
    return p, max(0, min(5, inp.H // p - 1))


def variant(inp: PlanInput, params: float, dcs: int, topology: str, stream: bool) -> PlanInput:
    """The plan of one cell of the scan."""
    k = inp.workers_per_dc[0] if topology == "hierarchical" else 1
    p, tau = streamed(inp) if stream else (1, 0)
    return replace(inp, params=float(params), data_centres=dcs, workers_per_dc=(k,),
                   step_time=tuple(s * params / inp.params for s in inp.step_time),
                   topology=topology, hierarchical=topology == "hierarchical",
                   fragments=p, overlap=tau).check()


def row(v: PlanInput, stream: bool) -> dict:
    tp = plan_topology(v)
    return {"params": v.params, "data_centres": v.data_centres, "topology": v.topology,
            "streamed": stream, "fragments": v.fragments, "overlap": v.overlap,
            "step_time": v.step_time[0], "bytes_per_site": tp.bytes_per_site,
            "bytes_total": tp.bytes_total, "bytes_per_exchange": tp.bytes_per_exchange,
            "time_per_outer_step": tp.time_per_update,
            "compute_utilisation": tp.compute_utilisation, "comm_fraction": tp.comm_fraction,
            "exposed": tp.exposed, "hidden": tp.hidden, "peak_bandwidth": tp.peak_bandwidth,
            "bandwidth_10pct": topology_bandwidth(v, 0.1)}


def scan(inp: PlanInput, sizes=None, dcs=None, topologies=TOPOLOGIES) -> list[dict]:
    inp.check()
    sizes = SIZES if sizes is None else sizes
    dcs = DATA_CENTRES if dcs is None else dcs
    return [row(variant(inp, p, d, t, s), s)
            for p in sizes for d in dcs for t in topologies for s in (False, True)]


def markdown(rows: list[dict]) -> str:
    """The scan as a Markdown table (bandwidths in bit/s)."""
    lines = ["| params | DCs | topology | streamed | bytes/site/outer step | total bytes | "
             "time/outer step | compute util. | bandwidth for <= 10% |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        stream = f"P={r['fragments']}, τ={r['overlap']}" if r["streamed"] else "no"
        bw = r["bandwidth_10pct"]
        lines.append(f"| {human(r['params'])} | {r['data_centres']} | {r['topology']} | "
                     f"{stream} | {human(r['bytes_per_site'], 'B')} | "
                     f"{human(r['bytes_total'], 'B')} | {seconds(r['time_per_outer_step'])} | "
                     f"{r['compute_utilisation']:.1%} | "
                     f"{human(8 * bw, 'bit/s') if bw != float('inf') else 'none enough'} |")
    return "\n".join(lines)


def run(inp: PlanInput, json_out: bool = False, plot: str | None = None,
        command: str = "", sizes=None, dcs=None) -> int:
    """``fedlm plan --scan``: print the table (or JSON); with ``plot``, write the two
    figures, ``scaling_topologies.json`` and ``scaling_topologies.md`` there."""
    from fedlm.plan.report import describe, input_dict

    sizes = SIZES if sizes is None else sizes
    dcs = DATA_CENTRES if dcs is None else dcs
    rows = scan(inp, sizes, dcs)
    result = jsonable({"plan": input_dict(inp), "command": command, "sizes": list(sizes),
                       "data_centres": list(dcs), "streamed": list(streamed(inp)),
                       "rows": rows})
    table = markdown(rows)
    print(json.dumps(result, indent=2) if json_out else table)
    if plot:
        from fedlm.plan import scan_plots

        out = Path(plot)
        out.mkdir(parents=True, exist_ok=True)
        paths = scan_plots.figures(inp, rows, out)
        (out / "scaling_topologies.json").write_text(json.dumps(result) + "\n")
        p, tau = streamed(inp)
        (out / "scaling_topologies.md").write_text(
            "# Communication by topology: model size x data centres\n\n"
            f"Written by\n\n    {command}\n\n"
            f"Plan: {describe(inp)}. The step time scales with the model size "
            f"({seconds(inp.step_time[0])} at {human(inp.params)} parameters); streamed: "
            f"P = {p} fragments, overlap τ = {tau} inner steps. Bytes per site: star and "
            "hierarchical up + down per data centre (the server moves DCs x that), ring "
            "sent per site (as much is received), tree the busiest site. See "
            "docs/scaling.md.\n\n" + table + "\n")
        paths += [out / "scaling_topologies.json", out / "scaling_topologies.md"]
        for path in paths:
            print(f"wrote {path}")
    return 0
