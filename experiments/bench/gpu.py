"""fedlm's inner loop on a GPU against a tuned plain loop on the same model and data.

    python experiments/bench/gpu.py                  # CUDA: 20m and 150m; else small on CPU
    python experiments/bench/gpu.py --models 20m --steps 100 --batch 32 --seq-len 256
    python experiments/bench/gpu.py --smoke    # seconds, on the CPU even beside a GPU:
                                               # tiny model, 2 steps, one fedlm run (the
                                               # others' settings loaded; with --arms,
                                               # those arms run), JSON to a temp dir

Plain loop (one process, fedlm's model and corpus, AdamW, grad clipping), variants:

  fp32                         what fedlm's worker did before inner.precision
  tf32                         TF32 matmuls (CUDA only)
  bf16                         autocast around forward + loss, fp32 weights and AdamW state
  bf16+fused                   + AdamW(fused=True) (CUDA only)
  bf16+fused+compile           + torch.compile (CUDA; on the CPU only with --compile)

against ``fedlm run --backend inprocess`` (4 workers, homogeneous fleet) with
sync DiLoCo and async delayed Nesterov, with ``inner.precision=auto`` (bf16 on a
GPU that has it) and, on CUDA, ``inner.compile=true``; and sync DiLoCo with the
4 workers' jobs running at once (``sim.job_threads``: on CUDA 4 jobs, a
stream each; on the CPU as many jobs as cores, with a core each). Reports tokens/s, MFU and
the ratio fedlm / plain (against the fastest plain variant and against plain
fp32); writes experiments/results/gpu.json with the device's name.

MFU counts 6·params + 12·layers·d_model·seq_len FLOPs per token (training,
attention included) against the device's dense bf16 peak (``PEAK_BF16``); an
unknown device, or the CPU, gets MFU null. On a machine without CUDA the
``small`` preset runs on the CPU with few steps, and the JSON and stdout say that
no GPU was there. The Flower simulation backend is not measured here (it needs
Ray, which the GPU image this was written for lacks: ../shared/FIELD_NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fedlm import config_load, data, model as model_lib  # noqa: E402
from fedlm.worker import precision  # noqa: E402
from fedlm.presets import PRESETS  # noqa: E402

# Dense bf16 peak FLOP/s by a substring of torch.cuda.get_device_name() (first match).
PEAK_BF16 = [("H200", 989e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12),
             ("L4", 121e12), ("A10", 125e12), ("4090", 165e12), ("V100", None)]


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def peak_flops(name: str) -> float | None:
    if name.startswith("CPU"):
        return None
    for key, peak in PEAK_BF16:
        if key in name:
            return peak
    return None


def flops_per_token(model: str, seq_len: int) -> float:
    n_layer, d_model, _, _ = PRESETS[model]
    params = model_lib.num_parameters(model_lib.build(model, seq_len, seed=0))
    return 6.0 * params + 12.0 * n_layer * d_model * seq_len


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def plain(model: str, variant: str, steps: int, batch: int, seq_len: int, device: str,
          warmup: int) -> dict:
    """The tuned plain loop: ``variant`` picks precision, fused AdamW and compile."""
    cfg = config_load.load(None, [f"model={model}", f"data.seq_len={seq_len}"])
    corpus = data.load_corpus(cfg.data)
    torch.manual_seed(0)
    net = model_lib.build(model, seq_len, seed=0, device=device)
    mode = "bf16" if "bf16" in variant else ("tf32" if variant == "tf32" else "fp32")
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.inner.lr, weight_decay=0.1,
                            betas=(0.9, 0.95), **({"fused": True} if "fused" in variant else {}))
    forward = torch.compile(net) if "compile" in variant else net
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(corpus.train), size=(steps + warmup, batch))
    seqs_all = torch.from_numpy(corpus.train[idx.reshape(-1)].astype(np.int64))
    seqs_all = seqs_all.to(device).view(steps + warmup, batch, -1)
    net.train()
    losses = []
    with precision.matmul_scope(mode, device):
        t0 = None
        for s in range(steps + warmup):
            if s == warmup:
                _sync(device)
                t0 = time.perf_counter()
            seqs = seqs_all[s]
            with precision.autocast(mode, device):
                _, loss = forward(seqs[:, :-1], seqs[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            losses.append(loss.detach())
        _sync(device)
        seconds = time.perf_counter() - t0
    tokens = steps * batch * seq_len
    return {"mode": f"plain {variant}", "steps": steps, "tokens": tokens, "seconds": seconds,
            "ms_per_step": 1000 * seconds / steps, "tokens_per_s": tokens / seconds,
            "final_loss": float(torch.stack(losses)[-1])}


def _replay(db: Path, run_id: int, timeout: int) -> str:
    """``fedlm replay`` of the run: "identical" if it re-executes to the same weights."""
    proc = subprocess.run([sys.executable, "-m", "fedlm", "replay", str(run_id), "--db",
                           str(db)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep
                               + os.environ.get("PYTHONPATH", "")})
    out = (proc.stdout + proc.stderr).strip().splitlines()
    return "identical" if proc.returncode == 0 and "identical" in proc.stdout else \
        f"not identical: {out[-1] if out else proc.returncode}"


def fedlm_run(label: str, sets: list[str], db: Path, timeout: int, replay: bool = False
              ) -> dict:
    """``fedlm run --backend inprocess`` in a fresh process; tokens/s from its store."""
    cmd = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", "inprocess",
           "--db", str(db)]
    for kv in sets:
        cmd += ["--set", kv]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{label}: fedlm run failed:\n{proc.stderr[-2000:]}")
    conn = sqlite3.connect(db)
    run_id = conn.execute("SELECT MAX(id) FROM runs").fetchone()[0]
    workers = conn.execute("SELECT COUNT(*) FROM workers WHERE run_id=?", (run_id,)).fetchone()[0]
    tokens, steps, compute = conn.execute(
        "SELECT SUM(tokens), SUM(local_steps), SUM(compute_seconds) FROM updates "
        "WHERE run_id=?", (run_id,)).fetchone()
    # steady state: the jobs after each worker's first (which pays for torch.compile)
    s_tokens, s_compute = conn.execute(
        "SELECT SUM(tokens), SUM(compute_seconds) FROM updates WHERE run_id=? AND job_id>=?",
        (run_id, workers)).fetchone()
    w0, w1 = conn.execute("SELECT MIN(wall_time), MAX(wall_time) FROM metrics WHERE run_id=?",
                          (run_id,)).fetchone()
    jobs = conn.execute("SELECT COUNT(*) FROM updates WHERE run_id=?", (run_id,)).fetchone()[0]
    conn.close()
    replayed = _replay(db, run_id, timeout) if replay else None
    return {"mode": label, "steps": steps, "tokens": tokens, "seconds": w1 - w0,
            "jobs": jobs, "replay": replayed,
            # one job at a time: the run span less the inner loops, per job
            "seconds_around_each_job": (w1 - w0 - compute) / jobs if jobs else None,
            "total_s": total, "tokens_per_s": tokens / (w1 - w0),
            "tokens_per_s_end_to_end": tokens / total,
            "tokens_per_s_compute": tokens / compute,
            "tokens_per_s_steady": (s_tokens / s_compute) if s_tokens and s_compute else None,
            "ms_per_step": 1000 * (w1 - w0) / steps}


def bench_model(model: str, args, device: str, peak: float | None) -> list[dict]:
    cuda = device == "cuda"
    variants = (["fp32", "tf32", "bf16", "bf16+fused", "bf16+fused+compile"] if cuda
                else ["fp32", "bf16"] + (["fp32+compile"] if args.compile else []))
    if args.variants:
        variants = [v for v in args.variants.split(",") if v]
    rows = []
    for v in variants:
        rows.append(plain(model, v, args.steps, args.batch, args.seq_len, device, args.warmup))
        print(f"  {model} {rows[-1]['mode']}: {rows[-1]['ms_per_step']:.1f} ms/step, "
              f"{rows[-1]['tokens_per_s']:,.0f} tok/s", flush=True)
    workers, h = 4, args.inner_steps
    rounds = args.rounds or max(2, args.steps // (workers * h) + 1)
    common = [f"model={model}", f"workers={workers}", f"inner.steps={h}",
              f"inner.batch_size={args.batch}", f"data.seq_len={args.seq_len}",
              "profile=homogeneous", "eval.batches=1", f"device={device}",
              f"inner.threads={torch.get_num_threads()}", "inner.precision=auto",
              f"inner.compile={'true' if cuda else 'false'}", "data.partition=iid"]
    cores = torch.get_num_threads()
    at_once = workers if cuda else max(2, min(workers, cores))
    threads_each = cores if cuda else max(1, cores // at_once)
    configs = [
        ("fedlm sync DiLoCo", ["strategy=diloco", f"updates={rounds}",
                               f"eval.every={rounds}"]),
        ("fedlm async delayed-nesterov", ["strategy=delayed-nesterov",
                                          f"updates={rounds * workers}",
                                          f"eval.every={rounds * workers}"]),
        # the 4 workers' jobs at once (sim.job_threads): on CUDA one stream each;
        # on the CPU as many jobs as cores, a core each
        (f"fedlm sync DiLoCo, {at_once} jobs at once",
         ["strategy=diloco", f"updates={rounds}", f"eval.every={rounds}",
          f"sim.job_threads={at_once}", f"inner.threads={threads_each}"]),
        # 16 workers of the same budget of rounds, per job and batched (sim.batched): what
        # one device gives many simulated workers (docs/gpu.md, "Batched workers")
        ("fedlm sync DiLoCo, 16 workers, per job",
         ["strategy=diloco", "workers=16", f"updates={rounds}", f"eval.every={rounds}",
          "sim.batched=off", "inner.compile=false"]),
        ("fedlm sync DiLoCo, 16 workers, batched",
         ["strategy=diloco", "workers=16", f"updates={rounds}", f"eval.every={rounds}",
          "sim.batched=on", "inner.compile=false"]),
        # arm 1 with the workers' AdamW states in (device) memory instead of the disk
        # files that checkpoints need: what the disk states cost around each job
        ("fedlm sync DiLoCo, states in memory",
         ["strategy=diloco", f"updates={rounds}", f"eval.every={rounds}",
          "inner.state_store=context"]),
        # arm 6 without torch.compile: a run pays the compile in its first jobs (about
        # 4.4 s at 20m on the H200, more than a round), the plain loop in its untimed
        # warm-up; where compiling gains little per step, a short run is faster without
        ("fedlm sync DiLoCo, states in memory, no compile",
         ["strategy=diloco", f"updates={rounds}", f"eval.every={rounds}",
          "inner.state_store=context", "inner.compile=false"])]
    if args.arms:  # a subset, by position: 1 sync, 2 async, 3 jobs at once, 4-5 16 workers,
        # 6 sync with states in memory, 7 the same without compile
        configs = [configs[int(k) - 1] for k in args.arms.split(",") if k]
    if args.smoke and not args.arms:  # one fedlm process (jobs at once); the others'
        for _, sets in configs:       # settings only loaded. With --arms: those arms
            config_load.load(None, [*common, *sets])
        configs = [c for c in configs if "jobs at once" in c[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for label, sets in configs:
            try:
                rows.append(fedlm_run(label, [*common, *sets], Path(tmp) / f"{len(rows)}.db",
                                      args.timeout,
                                      replay=args.replay and label == configs[0][0]))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                # one failed arm is reported in its row; the others' figures still count
                rows.append({"mode": label, "error": str(exc)[-2000:], "tokens_per_s": None,
                             "ms_per_step": None})
                print(f"  {model} {label}: FAILED ({str(exc).splitlines()[0]})", flush=True)
                continue
            print(f"  {model} {label}: {rows[-1]['tokens_per_s']:,.0f} tok/s (run span), "
                  f"{rows[-1]['tokens_per_s_compute']:,.0f} tok/s (inner loops)", flush=True)
    fpt = flops_per_token(model, args.seq_len)
    plains = [r for r in rows if r["mode"].startswith("plain")]
    best = max(plains, key=lambda r: r["tokens_per_s"])
    fp32 = next((r for r in plains if r["mode"] == "plain fp32"), None)  # not timed: none
    for r in rows:
        r["model"] = model
        ok = r["tokens_per_s"] is not None
        r["mfu"] = (r["tokens_per_s"] * fpt / peak) if peak and ok else None
        r["ratio_vs_best_plain"] = r["tokens_per_s"] / best["tokens_per_s"] if ok else None
        r["ratio_vs_plain_fp32"] = (r["tokens_per_s"] / fp32["tokens_per_s"]
                                    if ok and fp32 is not None else None)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="", help="comma-separated presets "
                    "(default: 20m,150m on CUDA, small on the CPU)")
    ap.add_argument("--steps", type=int, default=0, help="timed plain-loop steps "
                    "(default: 100 on CUDA, 8 on the CPU)")
    ap.add_argument("--warmup", type=int, default=0, help="untimed steps first "
                    "(default: 10 on CUDA, 1 on the CPU)")
    ap.add_argument("--batch", type=int, default=0, help="sequences per step (32 / 8)")
    ap.add_argument("--seq-len", type=int, default=0, help="tokens per sequence (256 / 128)")
    ap.add_argument("--inner-steps", type=int, default=0, help="fedlm's H (30 / 2)")
    ap.add_argument("--rounds", type=int, default=0, help="fedlm's sync rounds (default: "
                    "enough for --steps; more rounds weigh the first jobs' compile less)")
    ap.add_argument("--compile", action="store_true", help="also torch.compile on the CPU")
    ap.add_argument("--variants", default="", help="plain-loop variants to time, comma-"
                    "separated (default: all; without fp32 no ratio to it is given)")
    ap.add_argument("--arms", default="", help="fedlm runs, by number: 1 sync DiLoCo, 2 "
                    "async delayed Nesterov, 3 jobs at once, 4 and 5 sixteen workers per job "
                    "and batched, 6 sync DiLoCo with the AdamW states in memory, 7 the same without "
                    "torch.compile (default: all)")
    ap.add_argument("--replay", action="store_true", help="`fedlm replay` the first fedlm "
                    "run and report whether it re-executes to the same weights")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per fedlm run")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "gpu.json"))
    ap.add_argument("--smoke", action="store_true", help="the test suite's check: every "
                    "step on the CPU (even where CUDA is), tiny model, 2 steps, the JSON in a "
                    "temporary directory")
    args = ap.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            args.models = args.models or "tiny"
            args.steps, args.warmup, args.batch = args.steps or 2, args.warmup or 1, args.batch or 2
            args.seq_len, args.inner_steps = args.seq_len or 32, args.inner_steps or 1
            args.timeout, args.out = min(args.timeout, 300), str(Path(tmp) / "gpu.json")
            run(args, cuda=False)
        return
    run(args, cuda=torch.cuda.is_available())


def run(args, cuda: bool) -> None:
    device = "cuda" if cuda else "cpu"
    models = [m for m in args.models.split(",") if m] or (["20m", "150m"] if cuda else ["small"])
    args.steps = args.steps or (100 if cuda else 8)
    args.warmup = args.warmup or (10 if cuda else 1)
    args.batch = args.batch or (32 if cuda else 8)
    args.seq_len = args.seq_len or (256 if cuda else 128)
    args.inner_steps = args.inner_steps or (30 if cuda else 2)
    name = device_name(device)
    peak = peak_flops(name)
    note = ("" if cuda else f"NO GPU: torch sees no CUDA device here, so this ran "
            f"{', '.join(models)} on the CPU with few steps; these are CPU figures, "
            f"not GPU figures.")
    if args.smoke:
        note = (f"SMOKE: {', '.join(models)} on the CPU with {args.steps} steps, the code "
                f"path only; not measurements.")
    print(f"device: {name}" + (f"\n{note}" if note else ""), flush=True)
    t0 = time.perf_counter()
    rows = []
    for m in models:
        rows += bench_model(m, args, device, peak)
    print(f"\n{'model':>6} {'mode':>30} {'ms/step':>8} {'tok/s':>11} {'MFU':>6} "
          f"{'vs best':>7} {'vs fp32':>7}")
    for r in rows:
        if r["tokens_per_s"] is None:
            print(f"{r['model']:>6} {r['mode']:>30}   failed: {r['error'].splitlines()[-1]}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "—"
        print(f"{r['model']:>6} {r['mode']:>30} {r['ms_per_step']:>8.1f} "
              f"{r['tokens_per_s']:>11,.0f} {mfu:>6} {r['ratio_vs_best_plain']:>7.2f} "
              + (f"{r['ratio_vs_plain_fp32']:>7.2f}" if r["ratio_vs_plain_fp32"] is not None
                 else f"{'-':>7}"))
    if note:
        print(note)
    result = {"device": name, "gpu": cuda, "note": note or None, "torch": torch.__version__,
              "peak_bf16_flops": peak, "batch": args.batch, "seq_len": args.seq_len,
              "plain_steps": args.steps, "fedlm_rounds": args.rounds or None, "fedlm_workers": 4, "fedlm_inner_steps": args.inner_steps,
              "threads": torch.get_num_threads(), "seconds": time.perf_counter() - t0,
              "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
              "flower_backend": "not measured (needs Ray)", "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}" + (" (smoke: a temporary file, removed)" if args.smoke else ""))


if __name__ == "__main__":
    main()
