"""Streaming DiLoCo against DiLoCo on the `geo` fleet, at equal inner steps.

    python experiments/streaming.py --role tuning --seeds 100 101 --overlap 1 2 5 --mix 0.5
    python experiments/streaming.py --seeds 200 201 202 203 204 --overlap 1 5 --mix 0.5 \
        --no-ablation

The default run (`small` model, 4 workers in us/eu/asia, H = 30, 10 outer steps)
with `profile = geo`, as DiLoCo and as Streaming DiLoCo (`stream.fragments = 4`, each
`stream.overlap` of --overlap and each `stream.mix` of --mix), each seed of --seeds.
``--role tuning`` writes streaming_tuning.md (the seeds settings are chosen on);
the default ``--role report`` writes streaming.md, on seeds kept out of the tuning.
Every run is kept in runs/streaming.db and reused by name. Per arm: final
perplexity (mean, 95% t-interval over seeds; paired difference to DiLoCo),
bytes per exchange (the largest a worker sends or receives at once: what the
links must carry in one go), total bytes, exposed and hidden communication per
worker, virtual time. Writes experiments/archive/results/streaming.md and .json
(``--smoke``: the tiny model, 2 rounds, one seed, nothing written).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedlm import store  # noqa: E402
from fedlm.config_load import load  # noqa: E402
from fedlm.runner import run_inprocess  # noqa: E402
from fedlm.sweep.uncertainty import estimate, paired_estimate  # noqa: E402

BASE = ["profile=geo"]
STREAM = ["stream.fragments=4", "stream.overlap=5"]


def arms(mixes: list[float], overlaps: list[int] | None = None,
         ablation: bool = True) -> dict[str, list[str]]:
    """DiLoCo; streaming with each overlap and mix; and (ablation) the fragments
    without overlap."""
    out = {"DiLoCo": []}
    p, default_tau = (kv.split("=")[1] for kv in STREAM)
    for tau in overlaps or [int(default_tau)]:
        for mix in mixes:
            out[f"Streaming DiLoCo, P {p}, overlap {tau}, mix {mix:g}"] = [
                STREAM[0], f"stream.overlap={tau}", f"stream.mix={mix}"]
    if ablation:
        out[f"ablation: P {p}, no overlap"] = [STREAM[0]]
    return out


def _run(args: tuple) -> str:
    name, sets, db = args
    if Path(db).exists() and _finished(db, name) is not None:
        return f"{name}: reused"
    run_inprocess(load(None, [*sets, f"name={name}"]), db)
    return f"{name}: done"


def _finished(db: str, name: str) -> int | None:
    """The id of the finished run called ``name`` in ``db``, or None."""
    ids = [r["id"] for r in store.list_runs(db)
           if r["name"] == name and r["status"] == "finished"]
    return ids[-1] if ids else None


def measure(db: str, name: str) -> dict:
    run_id = _finished(db, name)
    s = store.summarize(db, run_id)
    moved = store.traffic(db, run_id)
    n = len(s.workers)
    return {"perplexity": s.final_perplexity, "virtual_time": s.virtual_time,
            "bytes_total": moved["down"] + moved["up"],
            "peak_exchange_bytes": moved["peak_exchange"],
            "exposed_comm_per_worker": sum(w.communication for w in s.workers) / n,
            "hidden_comm_per_worker": sum(w.hidden for w in s.workers) / n}


def timing_only(base: list[str], step_times: list[float], seed: int = 0,
                overlaps: list[int] | None = None) -> list[str]:
    """Virtual time and exposed communication of DiLoCo and streaming at faster
    compute (``fleet.base_step_time``), from fedlm's engine with the real model's
    tensors and an instant zero-update transport: a synchronous run's weights do not
    depend on its timing, so only the clock needs running."""
    from collections import OrderedDict

    import torch

    from fedlm import model as M
    from fedlm.engine.dry_run import run_clock
    from fedlm.sim import fleet
    from fedlm.store.schema import EXPOSED_COMM_KINDS

    lines = ["| s per inner step | arm | virtual time (s) | exposed comm / worker (s) | "
             "hidden comm / worker (s) |", "|---|---|---|---|---|"]
    for step in step_times:
        streams = [[STREAM[0], f"stream.overlap={tau}"] for tau in overlaps or [5]]
        for label, sets in [("DiLoCo", []), *((f"streaming, {', '.join(st)}", st)
                                               for st in streams)]:
            cfg = load(None, [*base, *sets, f"seed={seed}", f"fleet.base_step_time={step}",
                              "eval.every=1000000", "reliability.checkpoint_every=0"])
            net = M.build(cfg.model, cfg.data.seq_len, seed=0)
            zeros = OrderedDict((n, torch.zeros_like(p.detach())) for n, p in
                                net.named_parameters())
            engine, sec = run_clock(cfg, zeros)
            n = len(fleet.node_profiles(cfg))
            exposed = sum(sec.get(k, 0.0) for k in EXPOSED_COMM_KINDS) / n
            lines.append(f"| {step:g} | {label} | {engine.now:.1f} | {exposed:.2f} | "
                         f"{sec.get('hidden exchange', 0.0) / n:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--mix", type=float, nargs="+", default=[1.0, 0.5])
    ap.add_argument("--overlap", type=int, nargs="+", default=None,
                    help="stream.overlap values (default: 5)")
    ap.add_argument("--no-ablation", action="store_true",
                    help="leave out the fragments-without-overlap arm")
    ap.add_argument("--role", choices=["report", "tuning"], default="report",
                    help="tuning: the seeds settings are chosen on (streaming_tuning.md)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--db", default=str(ROOT / "runs" / "streaming.db"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny model, one seed, nothing kept")
    args = ap.parse_args()
    if args.out is None:
        stem = "streaming_tuning" if args.role == "tuning" else "streaming"
        args.out = str(ROOT / "experiments" / "archive" / "results" / stem)
    base = BASE
    if args.smoke:
        import tempfile
        args.seeds, args.mix, args.jobs = [0], [0.5], 1
        args.db = str(Path(tempfile.mkdtemp()) / "smoke.db")
        base = [*BASE, "model=tiny", "updates=1", "inner.steps=8", "eval.batches=2",
                "data.seq_len=64", "inner.batch_size=4"]
        global STREAM
        STREAM = ["stream.fragments=2", "stream.overlap=1"]
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    table = arms(args.mix, args.overlap, ablation=not (args.smoke or args.no_ablation))
    todo = [(f"{label} · seed {s}", [*base, *sets, f"seed={s}"], args.db)
            for label, sets in table.items() for s in args.seeds]
    # one run creates the store first: parallel first writers would race on the schema
    print(_run(todo[0]), flush=True)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for line in pool.map(_run, todo[1:]):
            print(line, flush=True)
    rows = {label: [measure(args.db, f"{label} · seed {s}") for s in args.seeds]
            for label in table}
    ref = {s: r["perplexity"] for s, r in zip(args.seeds, rows["DiLoCo"])}

    def interval(e) -> str:
        return f"{e.mean:.3f}" if e.half_width is None else f"{e.mean:.3f} ± {e.half_width:.3f}"

    lines = ["| arm | final perplexity (mean ± 95% CI) | vs DiLoCo, paired (%) | bytes per "
             "exchange | total bytes | exposed comm / worker (s) | hidden comm / worker (s) | "
             "virtual time (s) |", "|---|---|---|---|---|---|---|---|"]
    for label, rs in rows.items():
        ppl = estimate(r["perplexity"] for r in rs)
        diff = paired_estimate({s: r["perplexity"] for s, r in zip(args.seeds, rs)}, ref)

        def mean(key):
            return sum(r[key] for r in rs) / len(rs)
        vs = "" if label == "DiLoCo" else interval(diff).replace(".000", "")
        lines.append(f"| {label} | {interval(ppl)} | {vs} | "
                     f"{mean('peak_exchange_bytes') / 1e6:.2f} MB | "
                     f"{mean('bytes_total') / 1e6:.1f} MB | "
                     f"{mean('exposed_comm_per_worker'):.2f} | "
                     f"{mean('hidden_comm_per_worker'):.2f} | {mean('virtual_time'):.1f} |")
    timing = [] if args.role == "tuning" else timing_only(
        base, [1.0, 0.1, 0.02] if not args.smoke else [0.1],
        overlaps=[int(STREAM[1].split("=")[1])] if args.smoke else args.overlap)
    print("\n".join(lines))
    print("\n".join(timing))
    if args.smoke:
        return
    Path(args.out + ".json").write_text(json.dumps({"seeds": args.seeds, "runs": rows},
                                                   indent=2))
    head = ["# Streaming DiLoCo against DiLoCo on `geo`, at equal inner steps", "",
            f"`python experiments/streaming.py --seeds {' '.join(map(str, args.seeds))} "
            f"--overlap {' '.join(str(t) for t in args.overlap or [5])} "
            f"--mix {' '.join(f'{m:g}' for m in args.mix)}"
            f"{' --role tuning' if args.role == 'tuning' else ''}` (runs kept in "
            f"runs/streaming.db and reused by name). The default run with `profile = geo`: "
            f"`small` model, 4 workers (us, eu, asia, us), H = 30, 10 outer steps (300 inner "
            f"steps a worker); streaming with `{STREAM[0]}`. Seeds "
            f"{', '.join(map(str, args.seeds))}: "
            + ("the tuning seeds, on which settings are chosen (the report, streaming.md, "
               "uses other seeds)." if args.role == "tuning" else
               "held out; every setting was chosen on the tuning seeds "
               "(streaming_tuning.md).")
            + " Reading: docs/streaming.md, \"Measured\".", ""]
    timing_head = ["", "Timing only, seed 0 (the engine with the real model's tensors and an "
                   "instant transport: a synchronous run's weights do not depend on its "
                   "timing), at faster compute (`fleet.base_step_time`):", ""]
    Path(args.out + ".md").write_text(
        "\n".join(head + lines + (timing_head + timing if timing else [])) + "\n")
    print(f"wrote {args.out}.md, {args.out}.json")


if __name__ == "__main__":
    main()
