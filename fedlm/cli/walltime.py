"""``fedlm plan --walltime``: the idealized wall-clock model of the DiLoCo
scaling-laws paper (``fedlm.plan.walltime``), from the command line's text.

Its flags: --params N, --tokens D (default 20 N), --batch B (tokens), --chips R,
--flops-per-chip Q, --replicas M (default: --data-centres, or 2), --H,
--intra-bandwidth / --intra-latency (W0, ε0; default the paper's high network),
--inter-bandwidth / --inter-latency (W1, ε1; default its low one), --compression
(bits per parameter on the wire; default bf16, the paper's), --fragments, --overlap.
"""

from __future__ import annotations

import argparse
import json
import math

from fedlm.errors import ConfigError
from fedlm.cli.plan import parse_bandwidth, parse_count


def wall_input(args: argparse.Namespace):
    from fedlm.plan.walltime import NETWORKS, WallInput
    from fedlm.sim.wire_sizes import BYTES_PER_VALUE

    params = parse_count(args.params)
    compression = args.compression or "bf16"
    if compression not in BYTES_PER_VALUE:
        raise ConfigError(f"--compression: must be one of {', '.join(BYTES_PER_VALUE)}, "
                          f"got {compression!r}")
    tokens = parse_count(args.tokens, "--tokens") if args.tokens else 20 * params
    replicas = args.replicas if args.replicas is not None else (args.data_centres or 2)
    high, low = NETWORKS["high"], NETWORKS["low"]
    inp = WallInput(
        params=params, tokens=tokens, batch=parse_count(args.batch, "--batch"),
        chips=parse_count(args.chips, "--chips"),
        flops_per_chip=parse_count(args.flops_per_chip, "--flops-per-chip"),
        replicas=replicas, H=args.H,
        intra_bw=8 * parse_bandwidth(args.intra_bandwidth, "--intra-bandwidth")
        if args.intra_bandwidth else high[0],
        intra_latency=args.intra_latency,
        inter_bw=8 * parse_bandwidth(args.inter_bandwidth, "--inter-bandwidth")
        if args.inter_bandwidth else low[0],
        inter_latency=args.inter_latency if args.inter_latency is not None else low[1],
        bits=8 * BYTES_PER_VALUE[compression], fragments=args.fragments, overlap=args.overlap)
    try:
        return inp.check()
    except ConfigError as exc:  # name the flag, not the field
        name, _, rest = str(exc).partition(":")
        flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
        raise ConfigError(f"{flag}:{rest}") from None


_FLAGS = {"intra_bw": "--intra-bandwidth", "inter_bw": "--inter-bandwidth",
          "bits": "--compression"}


def cmd_walltime(args: argparse.Namespace) -> int:
    from fedlm.plan import walltime
    from fedlm.plan.report import human, jsonable, seconds

    inp = wall_input(args)
    rep = walltime.report(inp)
    if args.json:
        print(json.dumps(jsonable(rep), indent=2))
        return 0
    step = rep["input"]["step_compute"]
    print(f"{human(inp.params)} parameters, {human(inp.tokens)} tokens, batch "
          f"{human(inp.batch)} tokens (T = {inp.steps:,.0f} steps of {seconds(step)} compute), "
          f"{human(inp.chips)} chips x {human(inp.flops_per_chip, 'FLOP/s')}, M = "
          f"{inp.replicas}, H = {inp.H}; inside a data centre {human(inp.intra_bw, 'bit/s')}, "
          f"{seconds(inp.intra_latency)}; between {human(inp.inter_bw, 'bit/s')}, "
          f"{seconds(inp.inter_latency)}; {inp.bits:g} bits a parameter\n"
          "(Charles et al. 2025, appendix A: idealized wall-clock time)\n")
    width = max(len(a["label"]) for a in rep["algorithms"].values())
    print(f"{'':<{width}}  {'compute':>9}  {'inner comm':>10}  {'outer comm':>10}  "
          f"{'hidden':>9}  {'total':>9}  {'util':>6}")
    for a in rep["algorithms"].values():
        print(f"{a['label']:<{width}}  {seconds(a['compute']):>9}  "
              f"{seconds(a['inner_comm']):>10}  {seconds(a['outer_comm']):>10}  "
              f"{seconds(a['outer_hidden']):>9}  {seconds(a['total']):>9}  "
              f"{a['compute_utilisation']:>6.1%}")
    print(f"\nbandwidth between data centres (W1) for a compute utilisation of:")
    print(f"{'':<{width}}  " + "  ".join(f"{float(u):>11.0%}" for u in walltime.TARGETS))
    for a in rep["algorithms"].values():
        cells = ["unreachable" if not math.isfinite(b) else human(b, "bit/s")
                 for b in a["inter_bw_for"].values()]
        print(f"{a['label']:<{width}}  " + "  ".join(f"{c:>11}" for c in cells))
    return 0
