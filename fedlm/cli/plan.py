"""``fedlm plan``: the parsing of its flags' text, and the command.

The command line's side of the cost model (``fedlm.plan``): the text its flags
take (declared in ``fedlm.cli.parser``) turned into numbers — bandwidths in
bits/s (``1e9``, ``10Gbit``) or bytes/s (``1.25GB/s``), parameter counts
(``7B``), per-data-centre lists (``0.5,1,2``) — then a checked ``PlanInput``,
refused in one line naming the flag. Imports nothing heavy until the command runs.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedlm.errors import ConfigError

if TYPE_CHECKING:
    from fedlm.plan import PlanInput


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the plan (a table, or JSON) and write its plots if asked; or the scan
    (``--scan``), or the scaling-laws paper's wall-clock model (``--walltime``)."""
    import json

    if args.config is not None or args.set:
        from fedlm.cli.plan_config import plan_config, refuse_fleet_flags

        refuse_fleet_flags(args, _plan_actions())
        return plan_config(args, None if args.params is None else parse_count(args.params))
    if args.params is None:
        args.params = PARAMS
    if args.walltime:
        from fedlm.cli.walltime import print_walltime

        return print_walltime(wall_input(args), args.json)
    inp = input_from_args(args)
    if args.step_time is None:  # first, so that nobody reads the plan without it
        print(f"fedlm plan: {derived_step(args)[1]}", file=sys.stderr if args.json else sys.stdout,
              flush=True)
    if args.scan:
        from fedlm.plan import scan

        return scan.run(inp, json_out=args.json, plot=args.plot, command=command_line(args))
    from fedlm.plan import predict_topology, report

    out = predict_topology(inp)
    modes = ("sync", "async") if args.mode == "both" else (args.mode,)
    if args.json:
        print(json.dumps(report.report_dict(inp, out), indent=2))
    else:
        print(report.table(inp, out, modes))
    if args.plot:
        from fedlm.plan import plots

        for path in plots.scaling_plots(inp, Path(args.plot)):
            print(f"wrote {path}")
    return 0


PARAMS = "1e9"  # --params when neither it nor --config is given


def _plan_actions() -> list:
    """The argparse actions of ``fedlm plan``'s flags."""
    from fedlm.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["plan"]._actions


def command_line(args: argparse.Namespace) -> str:
    """``fedlm plan`` and the flags of ``args`` that differ from their defaults (the
    command a written result names)."""
    words = ["fedlm", "plan"]
    for action in _plan_actions():
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default or value is None or (action.dest == "params"
                                                         and value == PARAMS):
            continue
        flag = action.option_strings[0]
        words += [flag] if value is True else [flag, str(value)]
    return " ".join(words)


# ---------------------------------------------------------------------------
# Argument text
# ---------------------------------------------------------------------------

_UNITS = {"bit": 1 / 8, "bps": 1 / 8, "b": 1 / 8, "byte": 1.0, "B": 1.0}
_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_bandwidth(text: str, what: str = "--bandwidth") -> float:
    """A bandwidth in bytes/s from '1e9' (bits/s), '10Gbit', '10Gbps', '1.25GB' (bytes/s),
    '0' (unlimited, where allowed); an optional trailing '/s'."""
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([kKMGTP]?)(bit|bps|b|byte|B)?(/s)?\s*", text)
    try:
        value = float(m.group(1)) if m else math.nan
    except ValueError:
        value = math.nan
    if not m or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{what}: expected a bandwidth like 1e9 (bit/s), 10Gbit or 1.25GB/s, "
                          f"got {text!r}")
    unit = m.group(3) or "bit"
    return value * _PREFIX[m.group(2)] * _UNITS[unit]


def parse_list(text: str, what: str, parse=float) -> tuple:
    """'0.5' or '0.5,1,2' -> a tuple (per data centre, cycled)."""
    items = [t for t in text.split(",")]
    try:
        values = tuple(parse(t) for t in items)
    except ConfigError:
        raise
    except ValueError:
        raise ConfigError(f"{what}: expected a number or a comma-separated list, "
                          f"got {text!r}") from None
    if not values:
        raise ConfigError(f"{what}: expected at least one value, got {text!r}")
    return values


def input_from_args(args) -> PlanInput:
    """A checked ``PlanInput`` from ``fedlm plan``'s arguments (bandwidths in bits/s)."""
    from fedlm.plan import PlanInput

    workers, dcs = _fleet_size(args)
    topology = _topology(args)
    _check_compression(args)
    latency, down, up = _links(args)
    server_down = parse_bandwidth(args.server_down or args.server_bandwidth,
                                  "--server-down" if args.server_down else "--server-bandwidth")
    server_up = parse_bandwidth(args.server_up or args.server_bandwidth,
                                "--server-up" if args.server_up else "--server-bandwidth")
    inp = PlanInput(
        params=parse_count(args.params), data_centres=dcs, workers_per_dc=workers // dcs,
        step_time=step_times(args), H=args.H, latency=latency,
        down_bw=down, up_bw=up, server_down=server_down, server_up=server_up,
        compression=args.compression, down_compression=args.down_compression,
        block_size=args.block_size, jitter=args.jitter, daily_amplitude=args.daily_amplitude,
        hierarchical=topology == "hierarchical", topology=topology,
        fragments=args.fragments, overlap=args.overlap,
        intra_bw=parse_bandwidth(args.intra_bandwidth or "100Gbit", "--intra-bandwidth"))
    try:
        return inp.check_quantities()
    except ConfigError as exc:  # name the flag, not the field
        field_name, _, rest = str(exc).partition(":")
        name = flag(args, "H") if field_name == "H" else _FLAGS.get(field_name, field_name)
        raise ConfigError(f"{name}:{rest}") from None


def flag(args: argparse.Namespace, dest: str) -> str:
    """The flag of ``dest`` as the user spelled it (``--data-centers`` or
    ``--data-centres``, ``--local-steps`` or ``--H``: ``parser.Spelled``), else its
    first spelling: what a refusal names."""
    spelled = getattr(args, "spelled", None) or {}
    if dest in spelled:
        return spelled[dest]
    return next(a.option_strings[0] for a in _plan_actions() if a.dest == dest)


def _fleet_size(args) -> tuple[int, int]:
    """(workers, data centres), refused before anything is built per worker (a hundred
    million workers took 28 s to be refused). Without --workers, one worker per data
    centre (8 of each if neither is given); without --data-centres, one data centre
    per worker. A refusal names the flag given, not the one derived from it."""
    given_dcs = args.data_centres is not None
    if given_dcs and args.data_centres < 1:
        raise ConfigError(f"{flag(args, 'data_centres')}: must be >= 1, got "
                          f"{args.data_centres}")
    if given_dcs and args.data_centres > MAX_DATA_CENTRES:
        raise ConfigError(f"{flag(args, 'data_centres')}: must be <= {MAX_DATA_CENTRES:,}, "
                          f"got {args.data_centres}")
    workers = args.workers if args.workers is not None else (args.data_centres or 8)
    if workers < 1:  # only --workers can be out of range here
        raise ConfigError(f"--workers: must be >= 1, got {workers}")
    if workers > MAX_WORKERS:
        raise ConfigError(f"--workers: must be <= {MAX_WORKERS:,} in all, got {workers}")
    if not given_dcs and workers > MAX_DATA_CENTRES:  # a data centre per worker
        raise ConfigError(f"--workers: {workers:,} workers without --data-centres are a "
                          f"data centre each, more than the {MAX_DATA_CENTRES:,} fedlm "
                          f"plans; give --data-centres too")
    dcs = args.data_centres if given_dcs else workers
    if workers % dcs:
        raise ConfigError(f"--workers: {workers} workers do not spread evenly over {dcs} "
                          f"data centres ({flag(args, 'data_centres')} {dcs})")
    return workers, dcs


def _topology(args) -> str:
    """The exchange's topology, checked against the mode and a server bandwidth."""
    from fedlm.sim.collectives import ALLREDUCE, TOPOLOGIES

    if args.topology is not None:
        topology = args.topology
    else:
        topology = "hierarchical" if args.hierarchical else "star"
    if topology not in TOPOLOGIES:
        raise ConfigError(f"--topology: must be one of {', '.join(TOPOLOGIES)}, "
                          f"got {topology!r}")
    if args.hierarchical and topology != "hierarchical":
        raise ConfigError(f"--hierarchical: is --topology hierarchical, which contradicts "
                          f"--topology {topology}")
    streamed = args.fragments != 1 or args.overlap != 0
    if args.mode == "async" and (topology in ALLREDUCE or streamed):
        what, why = (f"--topology {topology}", "an all-reduce needs every site") \
            if topology in ALLREDUCE else ("streaming", "a synchronous outer step")
        raise ConfigError(f"--mode: {what} has no async variant ({why}), got 'async'")
    if topology in ALLREDUCE and (args.server_bandwidth != "0" or args.server_up
                                  or args.server_down):
        raise ConfigError(f"--server-bandwidth: --topology {topology} has no server, got "
                          f"{args.server_up or args.server_down or args.server_bandwidth!r}")
    return topology


def _check_compression(args) -> None:
    from fedlm.sim.wire_sizes import BYTES_PER_VALUE

    args.compression = args.compression or "fp32"
    for flag, value in (("--compression", args.compression),
                        ("--down-compression", args.down_compression)):
        if value not in BYTES_PER_VALUE:
            raise ConfigError(f"{flag}: must be one of {', '.join(BYTES_PER_VALUE)}, "
                              f"got {value!r}")


def _links(args) -> tuple[tuple, tuple, tuple]:
    """(latency, down, up) per data centre: named regions (fedlm's and HALoS's measured
    ones, the server in h0; "halos" alone: all four), or the flags' values."""
    from fedlm.config import FleetConfig
    from fedlm.sim import fleet, geo

    if args.regions is None:
        def bw(text, what):
            return parse_list(text, what, lambda t: parse_bandwidth(t, what))

        return (parse_list(args.latency, "--latency"),
                bw(args.down_bandwidth or args.bandwidth,
                   "--down-bandwidth" if args.down_bandwidth else "--bandwidth"),
                bw(args.up_bandwidth or args.bandwidth,
                   "--up-bandwidth" if args.up_bandwidth else "--bandwidth"))
    known = fleet.regions_of(FleetConfig(preset="halos"))
    names = (geo.HALOS_REGIONS if args.regions.strip() == "halos"
             else [n.strip() for n in parse_list(args.regions, "--regions", str)])
    for name in names:
        if name not in known:
            raise ConfigError(f"--regions: unknown region {name!r} "
                              f"(known: {', '.join(known)}, or halos)")
    regions = [known[n] for n in names]
    return (tuple(r.latency for r in regions), tuple(r.down_bw for r in regions),
            tuple(r.up_bw for r in regions))


_FLAGS = {"step_time": "--step-time", "H": "--H", "latency": "--latency",
          "down_bw": "--down-bandwidth", "up_bw": "--up-bandwidth", "workers": "--workers",
          "block_size": "--block-size", "jitter": "--jitter",
          "daily_amplitude": "--daily-amplitude", "params": "--params",
          "intra_bw": "--intra-bandwidth", "topology": "--topology",
          "fragments": "--fragments", "overlap": "--overlap"}


MAX_COUNT = 1e15  # 10x the 100T model of docs/scaling.md
MAX_WORKERS, MAX_DATA_CENTRES = 10_000_000, 1_000_000  # as fedlm.plan.inputs checks


def parse_count(text: str, what: str = "--params", limit: float = MAX_COUNT) -> float:
    """'1e9', '7B', '70b', '10M', '100T', '1.5k' -> a number, at most ``limit``."""
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([kKmMbBgGtT]?)\s*", text)
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    try:
        value = float(m.group(1)) * scale[m.group(2).lower()] if m else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 1:
        raise ConfigError(f"{what}: expected a number of parameters like 1e9 or 7B, "
                          f"got {text!r}")
    if value > limit:  # past any model or corpus the cost model was made for
        raise ConfigError(f"{what}: at most {limit:.0e}, got {text!r}")
    return value


def step_times(args: argparse.Namespace) -> tuple[float, ...]:
    """``--step-time``, or derived from the model when it is not given: a step costs
    about 6 x params x tokens FLOPs (forward and backward), done at ``--mfu`` of the
    data centre's ``--dc-flops``. The assumption is said (``derived_step``)."""
    if args.step_time is not None:
        return parse_list(args.step_time, "--step-time")
    return (derived_step(args)[0],)


def derived_step(args: argparse.Namespace) -> tuple[float, str]:
    """(seconds per inner step, the sentence that says how) from the model's FLOPs."""
    params, tokens = parse_count(args.params), parse_count(args.batch, "--batch")
    flops = parse_count(args.dc_flops, "--dc-flops", limit=1e24)
    if not 0 < args.mfu <= 1:
        raise ConfigError(f"--mfu: a share of the peak in (0, 1], got {args.mfu}")
    seconds = 6 * params * tokens / (flops * args.mfu)
    return seconds, (f"step time {seconds:.4g} s per inner step, derived: 6 x {params:.3g} "
                     f"parameters x {tokens:.3g} tokens / ({flops:.3g} FLOP/s per data centre "
                     f"x {args.mfu:.0%} utilisation); --step-time sets it")


def wall_input(args: argparse.Namespace):
    """A checked ``fedlm.plan.walltime.WallInput`` from ``fedlm plan --walltime``'s flags
    (bandwidths given in bits/s like every ``fedlm plan`` flag, parsed to bytes/s)."""
    from fedlm.plan.walltime import NETWORKS, WallInput
    from fedlm.sim.wire_sizes import BYTES_PER_VALUE

    params = parse_count(args.params)
    compression = args.compression or "bf16"
    if compression not in BYTES_PER_VALUE:
        raise ConfigError(f"--compression: must be one of {', '.join(BYTES_PER_VALUE)}, "
                          f"got {compression!r}")
    tokens = parse_count(args.tokens, "--tokens") if args.tokens else 20 * params
    if args.replicas is not None:
        replicas = args.replicas
    elif args.data_centres is not None:
        replicas = args.data_centres  # 0 too: refused
    else:
        replicas = 2
    high, low = NETWORKS["high"], NETWORKS["low"]
    inp = WallInput(
        params=params, tokens=tokens, batch=parse_count(args.batch, "--batch"),
        chips=parse_count(args.chips, "--chips"),
        flops_per_chip=parse_count(args.flops_per_chip, "--flops-per-chip"),
        replicas=replicas, H=args.H,
        intra_bw=parse_bandwidth(args.intra_bandwidth, "--intra-bandwidth")
        if args.intra_bandwidth else high[0],
        intra_latency=args.intra_latency,
        inter_bw=parse_bandwidth(args.inter_bandwidth, "--inter-bandwidth")
        if args.inter_bandwidth else low[0],
        inter_latency=args.inter_latency if args.inter_latency is not None else low[1],
        bytes_per_param=BYTES_PER_VALUE[compression], fragments=args.fragments,
        overlap=args.overlap)
    try:
        return inp.check()
    except ConfigError as exc:  # name the flag given, not the field
        name, _, rest = str(exc).partition(":")
        if name == "replicas" and args.replicas is None and args.data_centres is not None:
            given = flag(args, "data_centres")  # the replicas' count came from it
        elif name == "H":
            given = flag(args, "H")
        else:
            given = _WALL_FLAGS.get(name, "--" + name.replace("_", "-"))
        raise ConfigError(f"{given}:{rest}") from None


_WALL_FLAGS = {"intra_bw": "--intra-bandwidth", "inter_bw": "--inter-bandwidth",
               "bytes_per_param": "--compression"}
