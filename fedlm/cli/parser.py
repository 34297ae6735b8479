"""The ``fedlm`` command line's grammar: every command, flag, default and help text
(argparse), and the checks argparse makes on a flag's text alone (a run id, a
--db path, a count). Builds the parser; runs nothing.

Usage errors are one line, ``fedlm: error: ... (see fedlm --help)``, exit status 2,
like every other refusal of the command line.
"""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

DESCRIPTION = "The ``fedlm`` command line."


def one_line(message: object) -> str:
    """``message`` as one line: a multi-line one (TOML, sqlite3) joined with spaces."""
    text = str(message)
    if text.splitlines() == [text]:
        return text
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line too (exit status 2), like every other."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


class Spelled(argparse.Action):
    """Stores a flag that has several spellings and records the one given, in
    ``args.spelled`` (dest -> "--data-centers"), so that a refusal names the flag the
    user typed (``fedlm.cli.plan.flag``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.spelled = {**(getattr(namespace, "spelled", None) or {}),
                             self.dest: option_string}


def _int_arg(low: int, high: int, expected: str):
    """An argparse ``type``: an int in [low, high], else ``must be EXPECTED, got ...``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
        return value
    return parse


_run_id = _int_arg(1, 2**63 - 1, "a run id >= 1")
_positive_int = _int_arg(1, 1024, "between 1 and 1024")


def _db_path(text: str) -> str:
    """An argparse ``type`` for --db: a path, never the empty string (which would
    otherwise fall back to the default database without a word)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a path, got {text!r}")
    return text


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="TOML config file (default: the embedded default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set strategy=fedavg --set inner.lr=1e-3")


def _add_track_arg(p: argparse.ArgumentParser, what: str) -> None:
    from fedlm.config import TRACKERS

    p.add_argument("--track", action="append", choices=TRACKERS, default=[], metavar="NAME",
                   help=f"also send {what} to this experiment tracker ({', '.join(TRACKERS)}; "
                        f"repeatable; files under track.dir, runs/track; "
                        f"pip install 'fedlm[track]')")


def _add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=_db_path, default=None, help="run database (default: the "
                   "config's db, runs/fedlm.db)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedlm", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(sub)
    _add_store_parsers(sub)
    sub.add_parser("strategies", help="list the available strategies and local-steps policies")
    _add_sweep_parser(sub)
    _add_deploy_parser(sub)
    p = sub.add_parser("plan", help="cost model: time per outer step, communication, "
                       "utilisation and idle time of sync and async training (no run)")
    _add_plan_args(p)
    p = sub.add_parser("trace", help="write seeded FedScale-format device or availability "
                       "traces, or summarise one (docs/traces.md)")
    _add_trace_args(p)
    p = sub.add_parser("states", help="the workers' saved-state folders on this machine: "
                       "which a resume can use; --clean removes the others")
    p.add_argument("--clean", action="store_true", help="remove the folders no run can "
                   "resume from")
    p.add_argument("--older-than", type=_days, default=None, metavar="DAYS",
                   help="also count as removable a folder whose owner is unknown and "
                   "that nothing changed in for DAYS days")
    p = sub.add_parser("dashboard", help="serve the live dashboard (Streamlit)")
    _add_db_arg(p)
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default: loopback)")
    return parser


def _add_run_parser(sub) -> None:
    p = sub.add_parser("run", help="run a simulation on Flower's simulation engine")
    _add_config_args(p)
    _add_db_arg(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--backend", choices=("flower", "inprocess"), default="flower",
                   help="flower: Flower's simulation engine (Ray actors, the default); "
                        "inprocess: every job in this process, no Ray (debugging, sweeps)")
    p.add_argument("--resume", type=_run_id, default=None, metavar="RUN_ID",
                   help="continue run RUN_ID of --db from its newest intact checkpoint "
                        "(with its own config: no CONFIG or --set)")
    _add_track_arg(p, "the run's metrics, as they are written,")


def _add_store_parsers(sub) -> None:
    """The commands that read the run store: runs, show, export, config, replay."""
    p = sub.add_parser("runs", help="list stored runs")
    _add_db_arg(p)

    p = sub.add_parser("show", help="summary of one run")
    p.add_argument("run_id", type=_run_id)
    _add_db_arg(p)

    p = sub.add_parser("export", help="write a run's tables as CSV or Parquet, or send the "
                       "run to experiment trackers (--track)")
    p.add_argument("run_id", type=_run_id)
    _add_db_arg(p)
    p.add_argument("--format", choices=("csv", "parquet"), default="csv")
    p.add_argument("--out", default="runs/export", help="output folder (default: runs/export)")
    _add_track_arg(p, "the run's metrics (instead of writing tables)")
    p.add_argument("--track-dir", default=None, metavar="DIR",
                   help="the trackers' local folder (default: the run's track.dir)")

    p = sub.add_parser("config", help="print the resolved config as TOML")
    _add_config_args(p)

    p = sub.add_parser("replay", help="re-execute a run from its operation log and compare "
                       "the final weights' hash")
    p.add_argument("run_id", type=_run_id)
    _add_db_arg(p)


def _add_sweep_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run strategies x heterogeneity profiles and write a "
                       "report with tables and plots")
    p.add_argument("spec", help="sweep spec, e.g. experiments/configs/fleets_fair.toml")
    p.add_argument("--quick", action="store_true", help="the spec's reduced [quick] version")
    p.add_argument("--arms", action="append", default=None, metavar="TEXT",
                   help="only the arms whose label contains TEXT (any case; repeatable), "
                        "with the arms they are compared with; the whole spec later reuses "
                        "their runs")
    p.add_argument("--backend", choices=("flower", "inprocess"), default="flower")
    p.add_argument("--rerun", action="store_true", help="ignore finished runs of the same name")
    p.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                   help="runs at once (in-process backend; results do not change; default 1)")
    p.add_argument("--seeds", type=_positive_int, default=None, metavar="N",
                   help="run every arm with seeds 0..N-1 (replaces the spec's seeds); the "
                        "report gives means and 95%% intervals over them")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed run "
                   "(default: report it and go on with the others)")
    p.add_argument("--report-only", action="store_true", help="run nothing: write the report "
                   "from the runs already finished (the others show as not run)")
    p.add_argument("--db", type=_db_path, default=None, help="override the spec's run database")
    p.add_argument("--out", default=None, help="override the spec's report path")
    _add_track_arg(p, "each run's metrics, grouped by arm and profile,")


def _add_deploy_parser(sub) -> None:
    p = sub.add_parser("deploy", help="run on Flower's deployment engine (SuperLink + "
                       "SuperNodes) on this machine")
    p.add_argument("where", choices=("local",), help="local: every process on 127.0.0.1")
    p.add_argument("--workers", type=int, default=None, help="SuperNodes (default: config's)")
    _add_config_args(p)
    _add_db_arg(p)
    p.add_argument("--home", default="runs/deploy", help="the deployment's own folder "
                   "(default: runs/deploy): FLWR_HOME, keys, token, logs and app/, replaced "
                   "at every start. A new path is made and an empty folder adopted (a "
                   ".fedlm-deploy-home marker is written), a folder fedlm made is reused; "
                   "any other folder is refused, never touched")
    _add_track_arg(p, "the run's metrics, once it is over,")


def _float_arg(accept, expected: str):
    """An argparse ``type``: a finite float that ``accept`` takes, else ``must be
    EXPECTED, got ...`` (the float sibling of ``_int_arg``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
        if not (math.isfinite(value) and accept(value)):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
        return value
    return parse


_days = _float_arg(lambda v: v >= 0, "days >= 0")
_seconds = _float_arg(lambda v: v > 0, "seconds > 0")


def _add_trace_args(p: argparse.ArgumentParser) -> None:
    """``fedlm trace device | availability | show`` (``fedlm.cli.trace``)."""
    actions = p.add_subparsers(dest="action", required=True)
    for name, what in (("device", "each client's ms per sample and kbit/s"),
                       ("availability", "each client's active windows in a period")):
        q = actions.add_parser(name, help=f"write a seeded trace of {what}")
        q.add_argument("--clients", type=_int_arg(1, 1_000_000, "between 1 and 1000000"),
                       required=True, help="clients in the trace (ids 1..N)")
        q.add_argument("--seed", type=_int_arg(0, 2**63 - 1, "an integer >= 0"),
                       required=True, help="the same seed writes the same bytes")
        q.add_argument("--out", type=_db_path, required=True, help="the file to write")
        q.add_argument("--format", choices=("json", "pickle"), default=None,
                       help="default: pickle for .pkl/.pickle/.p, else json")
        if name == "availability":
            q.add_argument("--period", type=_seconds, default=518400.0,
                           help="finish_time, the trace's period in seconds (default "
                                "518400: 6 days, FedScale's)")
    q = actions.add_parser("show", help="summarise a trace file (JSON or FedScale's pickle)")
    q.add_argument("path")


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``fedlm plan``, as text: ``fedlm.cli.plan`` turns it into numbers
    (units, lists per data centre) and names the flag when it cannot."""
    _add_plan_fleet_args(p)
    _add_plan_link_args(p)
    _add_plan_output_args(p)
    _add_walltime_args(p)


def _add_plan_fleet_args(p: argparse.ArgumentParser) -> None:
    """What is planned: the model, the config, the fleet, the exchange, the compute."""
    p.add_argument("--params", default=None, help="model parameters: 1e9, 7B, 70B, 100T "
                   "(default 1e9; with --config, the config's model)")
    p.add_argument("--config", default=None, help="plan a run config (TOML): its fleet, "
                   "links, H, network and strategy, halos included; with --set, not the "
                   "fleet flags below")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="with or without --config: a config override, as fedlm run's")
    p.add_argument("--workers", type=int, default=None, help="workers in all (default: one "
                   "per data centre, or 8 without --data-centres)")
    p.add_argument("--data-centres", "--data-centers", dest="data_centres", type=int,
                   default=None, action=Spelled, help="data centres the workers are spread "
                   "over, evenly (default: one per worker); per-DC values below cycle over them")
    p.add_argument("--topology", default=None, help="how outer gradients are exchanged: star "
                   "(a parameter server, the default), ring or tree (an all-reduce among the "
                   "nodes, sync only), hierarchical (a star of data-parallel pods)")
    p.add_argument("--fragments", type=int, default=1, help="Streaming DiLoCo: exchange the "
                   "model in P fragments, one every H/P inner steps (default 1: whole)")
    p.add_argument("--overlap", type=int, default=0, help="Streaming DiLoCo: inner steps of the "
                   "next segment a fragment's exchange may hide behind, < H/P (default 0)")
    p.add_argument("--mode", choices=("both", "sync", "async"), default="both",
                   help="which strategies to show (default both; ring, tree and streaming "
                   "are sync only)")
    p.add_argument("--step-time", default=None, help="seconds per inner step, or a list per "
                   "data centre: 0.5,1,2 (default: derived from the model, 6 x --params x "
                   "--batch tokens FLOPs over --dc-flops x --mfu; the first line says so)")
    p.add_argument("--dc-flops", default="1e18", help="peak FLOP/s of one data centre's "
                   "chips, for the derived step time (default 1e18: about 1,000 H100s)")
    p.add_argument("--mfu", type=float, default=0.4, help="the share of --dc-flops a step "
                   "gets, for the derived step time (default 0.4)")
    p.add_argument("--H", "--local-steps", dest="H", type=int, default=100, action=Spelled,
                   help="inner steps per job (default 100)")


def _add_plan_link_args(p: argparse.ArgumentParser) -> None:
    """The links: each data centre's, the server's own, what travels on them."""
    p.add_argument("--bandwidth", default="1e9", help="each data centre's link to the server, "
                   "both ways: bits/s (1e9), or 10Gbit, 1.25GB/s; a list per DC (default 1e9)")
    p.add_argument("--down-bandwidth", default=None, help="server -> worker, if not --bandwidth")
    p.add_argument("--up-bandwidth", default=None, help="worker -> server, if not --bandwidth")
    p.add_argument("--latency", default="0.05", help="one-way seconds per transfer, or a list "
                   "per DC (default 0.05)")
    p.add_argument("--regions", default=None, help="per-DC links from fedlm's regions, cycled: "
                   "local,us,eu,asia, or HALoS's measured h0,h1,h2,h3 (server in h0); "
                   "'halos' for all four (replaces --bandwidth and --latency)")
    p.add_argument("--server-bandwidth", default="0", help="the server's own link, shared by all "
                   "transfers each way (0: unlimited, the default)")
    p.add_argument("--server-down", default=None, help="server egress, if not --server-bandwidth")
    p.add_argument("--server-up", default=None, help="server ingress, if not --server-bandwidth")
    p.add_argument("--compression", default=None, help="uploads as fp32, bf16, fp16, int8 or "
                   "int4 (default fp32; --walltime: bf16, the paper's)")
    p.add_argument("--down-compression", default="fp32", help="the global model sent down as "
                   "(default fp32, as the simulator does)")
    p.add_argument("--block-size", type=int, default=256, help="values per int8/int4 scale "
                   "(0: one per tensor; default 256)")
    p.add_argument("--hierarchical", action="store_true", help="the same as --topology "
                   "hierarchical: a data centre's workers train as one data-parallel pod; only "
                   "the pod talks to the server")
    p.add_argument("--intra-bandwidth", default=None, help="inside a data centre, for the "
                   "pod's all-reduce (default 100Gbit; --walltime: 400Gbit, the paper's)")
    p.add_argument("--jitter", type=float, default=0.05, help="sigma of the lognormal "
                   "compute-time jitter (default 0.05, as fleet.jitter)")
    p.add_argument("--daily-amplitude", type=float, default=0.0, help="bandwidth dips by this "
                   "fraction once a day (default 0: off)")


def _add_plan_output_args(p: argparse.ArgumentParser) -> None:
    """What the plan prints or writes."""
    p.add_argument("--plot", default=None, metavar="OUT_DIR", help="also write the scaling "
                   "plots (vs model size, vs data centres) as PNG files there (--scan: its "
                   "two figures, its JSON and a Markdown table)")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")
    p.add_argument("--scan", action="store_true", help="tabulate 1B..100T parameters x 2..100 "
                   "data centres, star / ring / tree / hierarchical, whole and streamed; "
                   "the step time given at --params scales with the model size")


def _add_walltime_args(p: argparse.ArgumentParser) -> None:
    """--walltime: the wall-clock model of Charles et al. 2025 and its inputs."""
    p.add_argument("--walltime", action="store_true", help="the wall-clock model of Charles et "
                   "al. 2025 (Scaling Laws for DiLoCo, appendix A): data-parallel vs DiLoCo "
                   "over data centres; see docs/scaling.md")
    p.add_argument("--tokens", default=None, help="--walltime: training tokens (default 20 x "
                   "--params, Chinchilla)")
    p.add_argument("--batch", default="4M", help="global batch in tokens per inner step, for "
                   "the derived step time and --walltime (default 4M)")
    p.add_argument("--replicas", type=int, default=None, help="--walltime: DiLoCo replicas M, "
                   "one per data centre (default: --data-centres, or 2)")
    p.add_argument("--chips", default="1e4", help="--walltime: chips R in all (default 1e4)")
    p.add_argument("--flops-per-chip", default="300e12", help="--walltime: achieved FLOP/s "
                   "per chip Q (default 300e12, the paper's)")
    p.add_argument("--inter-bandwidth", default=None, help="--walltime: the network between "
                   "data centres, W1 (default 10Gbit: the paper's low-bandwidth archetype)")
    p.add_argument("--inter-latency", type=float, default=None, help="--walltime: its latency "
                   "e1 in seconds (default 1e-2)")
    p.add_argument("--intra-latency", type=float, default=1e-4, help="--walltime: latency "
                   "inside a data centre e0 (default 1e-4)")
