"""Batched workers (``sim.batched``) against one job at a time, on the CPU.

    python experiments/bench/batched.py            # whole runs, 3 repeats each
    python experiments/bench/batched.py --quick    # 1 repeat, shorter runs (a few minutes)
    python experiments/bench/batched.py --smoke    # seconds; nothing written
    python experiments/bench/batched.py --device cuda --quick   # on a GPU: batched-gpu.json

Two parts, both measured as ratios inside one call, the two sides interleaved (off,
on, then on, off: ABBA), so the machine's load hits both:

- **runs**: ``fedlm run --backend inprocess`` (``run_inprocess``) with ``sim.batched``
  off and on, tokens/s over the whole run (its wall time, start and end evaluation,
  checkpoints and the workers' disk states included) and over its inner loops alone
  (the jobs' ``compute_seconds``): ``tiny`` with 16 workers and ``small`` with 8, sync
  DiLoCo and delayed Nesterov + DyLU (so a group's jobs have different H), on the
  default shapes (batch 8 × 128 tokens) and, for ``tiny``, the tests' (4 × 64). Each
  arm trains the same inner-step budget either way. The runs' final weights are
  compared too (relative L2 distance, against how far training moved them).
- **variants**: one inner step (forward, backward, clipping, AdamW) of K replicas: K
  models one after another (the per-job loop), one stacked computation with a replica
  dimension in the weights (``fedlm.worker.stacked``, bmm), and ``torch.func.vmap``
  over ``functional_call`` of fedlm's model with stacked weights. fedlm keeps the
  faster of the two batched ways (bmm; the vmap variant lives only here).

Writes experiments/results/batched-cpu.json with the machine (cores, CPU, load
average before and after); with ``--device cuda``, batched-gpu.json with the GPU's name
(there the runs keep the workers' states in device memory, ``checkpoint_every = 0``,
and train in ``inner.precision = auto``: bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this tree's fedlm, not whichever is installed

from fedlm import checkpoint, config_load, model as model_lib, start  # noqa: E402
from fedlm.config import InnerConfig  # noqa: E402
from fedlm.runner import prepare_data, run_inprocess  # noqa: E402
from fedlm.store import connect_readonly  # noqa: E402
from fedlm.worker import precision, stacked  # noqa: E402
from fedlm.worker.stacked_adamw import StackedAdamW, clip_grad_norms  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
STRATEGIES = {"sync DiLoCo": ["strategy=diloco"],
              "DN + DyLU": ["strategy=delayed-nesterov", "local_steps=dylu"]}
# (model, workers, batch, seq_len, H, rounds): rounds x H inner steps per worker
ARMS = [("tiny", 16, 8, 128, 10, 3), ("tiny", 16, 4, 64, 10, 3), ("small", 8, 8, 128, 10, 2)]
QUICK = [("tiny", 16, 8, 128, 5, 2), ("tiny", 16, 4, 64, 5, 2), ("small", 8, 8, 128, 5, 1)]
SMOKE = [("tiny", 4, 4, 32, 2, 1)]
GPU_ARMS = [("tiny", 16, 8, 128, 10, 3), ("small", 8, 8, 128, 10, 3), ("20m", 8, 32, 256, 10, 2)]
GPU_QUICK = [("tiny", 16, 8, 128, 10, 2), ("small", 8, 8, 128, 10, 2), ("20m", 8, 32, 256, 5, 2)]


def machine(device: str) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    return {"cores": os.cpu_count(), "cpu": cpu, "gpu": gpu, "torch": torch.__version__,
            "python": platform.python_version(), "load_average": list(os.getloadavg())}


# -- whole runs ----------------------------------------------------------------------

def arm_config(arm: tuple, strategy: list[str], mode: str, device: str = "cpu"):
    model, workers, batch, seq, steps, rounds = arm
    gpu = ["reliability.checkpoint_every=0"] if device == "cuda" else []
    return config_load.load(None, [f"device={device}", *gpu,
        f"model={model}", f"workers={workers}", f"inner.batch_size={batch}",
        f"data.seq_len={seq}", f"inner.steps={steps}", "updates=1000000",
        f"local_step_budget={workers * steps * rounds}", "eval.every=1000000",
        "inner.threads=1", f"sim.batched={mode}", *strategy])


def timed_run(cfg, folder: str) -> dict:
    db = tempfile.mktemp(suffix=".db", dir=folder)
    t0 = time.perf_counter()
    run_id = run_inprocess(cfg, db)
    seconds = time.perf_counter() - t0
    with connect_readonly(db) as conn:
        tokens, compute = conn.execute("SELECT SUM(tokens), SUM(compute_seconds) FROM updates"
                                       " WHERE run_id=?", (run_id,)).fetchone()
        (final_hash,) = conn.execute("SELECT final_hash FROM runs WHERE id=?",
                                     (run_id,)).fetchone()
    weights = checkpoint.read(checkpoint.weights_for(db, run_id))["params"]
    return {"seconds": seconds, "tokens": tokens, "compute_seconds": compute,
            "final_hash": final_hash, "weights": weights}


def relative_distance(a: dict, b: dict, start_params: dict) -> float:
    """‖a − b‖₂ / ‖b − start‖₂ over the whole model."""
    def norm(pairs):
        return sum(((x.double() - y.double()) ** 2).sum() for x, y in pairs).sqrt().item()
    return (norm((a[k], b[k]) for k in b) / norm((b[k], start_params[k]) for k in b))


def bench_arm(arm: tuple, strategy: str, repeats: int, folder: str, device: str) -> dict:
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(repeats):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):  # ABBA
            cfg = arm_config(arm, STRATEGIES[strategy], mode, device)
            runs[mode].append(timed_run(cfg, folder))
    per = {mode: {"tokens_per_s": [x["tokens"] / x["seconds"] for x in rs],
                  "inner_tokens_per_s": [x["tokens"] / x["compute_seconds"] for x in rs],
                  "run_seconds": [x["seconds"] for x in rs]} for mode, rs in runs.items()}
    model, workers, batch, seq, steps, rounds = arm
    off, on = runs["off"][0], runs["on"][0]
    row = {
        "model": model, "workers": workers, "batch": batch, "seq_len": seq, "H": steps,
        "inner_steps_per_worker": steps * rounds, "strategy": strategy, "repeats": repeats,
        "tokens": off["tokens"], **{f"{m}_{k}": v for m, d in per.items() for k, v in d.items()},
        # the ratio of the summed times: each repeat pair shares the load of its moment
        "ratio_run": sum(per["off"]["run_seconds"]) / sum(per["on"]["run_seconds"]),
        "ratio_run_per_repeat": [a / b for a, b in zip(per["off"]["run_seconds"],
                                                       per["on"]["run_seconds"])],
        "ratio_inner": (sum(x["compute_seconds"] for x in runs["off"])
                        / sum(x["compute_seconds"] for x in runs["on"])),
        "same_tokens": off["tokens"] == on["tokens"],
        "on_replays_identically_across_repeats": len({x["final_hash"] for x in runs["on"]}) == 1,
        "final_weights_relative_distance": relative_distance(
            on["weights"], off["weights"], start.initial(arm_config(arm, [], "off")))}
    print(f"{model:5} x{workers:2} {batch}x{seq:<3} {strategy:12} tokens/s off "
          f"{statistics.mean(per['off']['tokens_per_s']):8.0f} on "
          f"{statistics.mean(per['on']['tokens_per_s']):8.0f}  run x{row['ratio_run']:.2f}  "
          f"(repeats {', '.join(f'{x:.2f}' for x in row['ratio_run_per_repeat'])})  "
          f"inner loops x{row['ratio_inner']:.2f}  weights differ by "
          f"{row['final_weights_relative_distance']:.1e}", flush=True)
    return row


# -- one inner step, three ways --------------------------------------------------------

def step_variants(preset: str, replicas: int, batch: int, seq: int, repeats: int,
                  device: str = "cpu") -> dict:
    from torch.func import functional_call, grad_and_value, vmap

    torch.set_num_threads(1)
    cfg = model_lib.model_config(preset, seq)
    inner = InnerConfig()
    mode = precision.resolve("auto", device)  # bf16 on a GPU that has it, else fp32
    idx = torch.randint(0, cfg.vocab_size, (replicas, batch, seq + 1),
                        generator=torch.Generator().manual_seed(0)).to(device)
    nets = [model_lib.build(preset, seq, seed=k, device=device) for k in range(replicas)]
    fused = {"fused": True} if precision.fused_adamw(device) else {}
    opts = [torch.optim.AdamW(n.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                              **fused) for n in nets]
    names = [n for n, _ in nets[0].named_parameters()]

    def stacked_weights():
        return {n: torch.stack([dict(m.named_parameters())[n].detach() for m in nets]).clone()
                for n in names}

    def per_job():
        for net, opt, rows in zip(nets, opts, idx):
            with precision.autocast(mode, device):
                _, loss = net(rows[:, :-1], rows[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()

    bmm_w = stacked_weights()
    bmm_opt = StackedAdamW(bmm_w, inner, [0] * replicas, [[1e-3] * 64] * replicas)

    def bmm():
        rows = {n: p.detach().requires_grad_() for n, p in bmm_w.items()}
        with precision.autocast(mode, device):
            loss = stacked.losses(rows, idx[..., :-1], idx[..., 1:], cfg)
        loss.sum().backward()
        clip_grad_norms(rows, 1.0)
        bmm_opt.step(rows, replicas)

    vmap_w = stacked_weights()
    vmap_opt = StackedAdamW(vmap_w, inner, [0] * replicas, [[1e-3] * 64] * replicas)
    one = nets[0]
    grads = vmap(grad_and_value(lambda p, x, y: functional_call(one, p, (x, y))[1]))

    def vmapped():
        with precision.autocast(mode, device):
            g, _ = grads(vmap_w, idx[..., :-1], idx[..., 1:])
        rows = {n: p.detach().requires_grad_() for n, p in vmap_w.items()}
        for n, p in rows.items():
            p.grad = g[n]
        clip_grad_norms(rows, 1.0)
        vmap_opt.step(rows, replicas)

    ways = {"per_job": per_job, "bmm": bmm, "vmap": vmapped}
    seconds = dict.fromkeys(ways, 0.0)
    failed = {}
    with warnings.catch_warnings():  # vmap: "no batching rule" for CPU flash attention
        warnings.simplefilter("ignore")
        for name, fn in list(ways.items()):
            try:
                fn()  # warm-up
            except Exception as exc:  # noqa: BLE001 - one way failing leaves the others
                failed[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                del ways[name]
                seconds[name] = float("nan")
        for _ in range(repeats):  # interleaved
            for name, fn in ways.items():
                sync(device)
                t0 = time.perf_counter()
                fn()
                sync(device)
                seconds[name] += time.perf_counter() - t0
    row = {"model": preset, "replicas": replicas, "batch": batch, "seq_len": seq,
           "precision": mode,
           "repeats": repeats, **{f"{k}_ms_per_step": 1e3 * v / repeats for k, v in seconds.items()},
           "bmm_speedup": seconds["per_job"] / seconds["bmm"],
           "vmap_speedup": seconds["per_job"] / seconds["vmap"], "failed": failed}
    print(f"{preset:5} K={replicas:2} {batch}x{seq:<3} one step: per job "
          f"{row['per_job_ms_per_step']:7.1f} ms, bmm x{row['bmm_speedup']:.2f}, "
          f"vmap x{row['vmap_speedup']:.2f}", flush=True)
    return row


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat, shorter runs")
    ap.add_argument("--smoke", action="store_true", help="seconds; nothing written")
    ap.add_argument("--repeats", type=int, default=None, help="ABBA repeats per arm")
    ap.add_argument("--skip-runs", action="store_true", help="only the step variants")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--arm", action="append", default=None, metavar="M,W,B,T,H,R",
                    help="a whole-run arm instead of the defaults: model, workers, batch, "
                         "seq_len, H, rounds (repeatable)")
    ap.add_argument("--variant", action="append", default=None, metavar="M,K,B,T",
                    help="a one-step variant instead of the defaults: model, replicas, batch, "
                         "seq_len (repeatable)")
    ap.add_argument("--out", default=None, help="the JSON's path (default: "
                    "experiments/results/batched-cpu.json or -gpu.json)")
    args = ap.parse_args()
    gpu = args.device == "cuda"
    arms = (SMOKE if args.smoke else (GPU_QUICK if gpu else QUICK) if args.quick
            else GPU_ARMS if gpu else ARMS)
    repeats = args.repeats or (1 if args.smoke or args.quick else 3)
    variants = ([("tiny", 4, 4, 32)] if args.smoke else
                [("tiny", 16, 8, 128), ("small", 8, 8, 128), ("20m", 8, 32, 256)] if gpu else
                [("tiny", 16, 8, 128), ("tiny", 16, 4, 64), ("small", 8, 8, 128)] if args.quick
                else [("tiny", 16, 8, 128), ("tiny", 16, 4, 64), ("tiny", 16, 8, 64),
                      ("tiny", 16, 4, 128), ("tiny", 8, 8, 128), ("tiny", 32, 8, 128),
                      ("tiny", 1, 4, 64), ("tiny", 2, 4, 64), ("small", 8, 8, 128),
                      ("small", 4, 8, 128), ("small", 8, 4, 64)])
    if args.arm:
        arms = [_fields(a, 6) for a in args.arm]
    if args.variant:
        variants = [_fields(v, 4) for v in args.variant]
    before = machine(args.device)
    print(f"{before['cores']} cores ({before['cpu']}), GPU {before['gpu']}, load average "
          f"{before['load_average']}", flush=True)
    t0 = time.perf_counter()
    rows = [step_variants(*v, repeats=2 if args.smoke else 4 if args.quick else 12,
                          device=args.device) for v in variants]
    results = []
    if not args.skip_runs:
        with tempfile.TemporaryDirectory() as folder:
            for arm in arms:
                prepare_data(arm_config(arm, [], "off"))  # tokenized once, outside the timing
                results += [bench_arm(arm, s, repeats, folder, args.device) for s in STRATEGIES]
    after = machine(args.device)["load_average"]
    print(f"load average after: {after}; {time.perf_counter() - t0:.0f} s", flush=True)
    if args.smoke:
        print("smoke: nothing written")
        return
    out = Path(args.out) if args.out else RESULTS / f"batched-{'gpu' if gpu else 'cpu'}.json"
    out.write_text(json.dumps({
        "machine": {**before, "load_average_after": after},
        "note": ("ratios are batched over per-job, measured in one call with the sides "
                 "interleaved (ABBA); inner.threads = 1; the machine ran other work"),
        "quick": args.quick, "runs": results, "step_variants": rows}, indent=1) + "\n")
    print(f"wrote {out}")


def _fields(text: str, n: int) -> tuple:
    """"20m,16,32,256" -> ("20m", 16, 32, 256): a model name, then integers."""
    parts = text.split(",")
    if len(parts) != n:
        raise SystemExit(f"batched.py: {text!r} needs {n} comma-separated fields")
    return (parts[0], *(int(x) for x in parts[1:]))


if __name__ == "__main__":
    main()
