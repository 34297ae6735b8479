"""``fedlm plan --walltime``: the table of the idealized wall-clock model of the
DiLoCo scaling-laws paper (``fedlm.plan.walltime``); its flags' text is parsed in
``fedlm.cli.plan.wall_input``.

Its flags: --params N, --tokens D (default 20 N), --batch B (tokens), --chips R,
--flops-per-chip Q, --replicas M (default: --data-centres, or 2), --H,
--intra-bandwidth / --intra-latency (W0, ε0; default the paper's high network),
--inter-bandwidth / --inter-latency (W1, ε1; default its low one), --compression
(a parameter's size on the wire; default bf16, the paper's), --fragments, --overlap.
Bandwidths are taken and printed in bit/s, as the paper quotes them; the model and
its JSON work in bytes/s (its "units" entry says so).
"""

from __future__ import annotations

import json
import math


def print_walltime(inp, as_json: bool) -> int:
    """Print the model's table (or JSON) for a checked ``WallInput`` (parsed from the
    flags by ``fedlm.cli.plan.wall_input``)."""
    from fedlm.plan import walltime
    from fedlm.plan.report import human, jsonable, seconds

    rep = walltime.report(inp)
    if as_json:
        print(json.dumps(jsonable(rep), indent=2))
        return 0
    step = rep["input"]["step_compute"]
    print(f"{human(inp.params)} parameters, {human(inp.tokens)} tokens, batch "
          f"{human(inp.batch)} tokens (T = {inp.steps:,.0f} steps of {seconds(step)} compute), "
          f"{human(inp.chips)} chips x {human(inp.flops_per_chip, 'FLOP/s')}, M = "
          f"{inp.replicas}, H = {inp.H}; inside a data centre "
          f"{human(8 * inp.intra_bw, 'bit/s')}, {seconds(inp.intra_latency)}; between "
          f"{human(8 * inp.inter_bw, 'bit/s')}, {seconds(inp.inter_latency)}; "
          f"{8 * inp.bytes_per_param:g} bits a parameter\n"
          "(Charles et al. 2025, appendix A: idealized wall-clock time)\n")
    width = max(len(a["label"]) for a in rep["algorithms"].values())
    print(f"{'':<{width}}  {'compute':>9}  {'inner comm':>10}  {'outer comm':>10}  "
          f"{'hidden':>9}  {'total':>9}  {'util':>6}")
    for a in rep["algorithms"].values():
        print(f"{a['label']:<{width}}  {seconds(a['compute']):>9}  "
              f"{seconds(a['inner_comm']):>10}  {seconds(a['outer_comm']):>10}  "
              f"{seconds(a['outer_hidden']):>9}  {seconds(a['total']):>9}  "
              f"{a['compute_utilisation']:>6.1%}")
    print("\nbandwidth between data centres (W1) for a compute utilisation of:")
    print(f"{'':<{width}}  " + "  ".join(f"{float(u):>11.0%}" for u in walltime.TARGETS))
    for a in rep["algorithms"].values():
        cells = ["unreachable" if not math.isfinite(b) else human(8 * b, "bit/s")
                 for b in a["inter_bw_for"].values()]
        print(f"{a['label']:<{width}}  " + "  ".join(f"{c:>11}" for c in cells))
    return 0
