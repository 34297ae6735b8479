"""fedlm's overhead over a plain PyTorch training loop, measured side by side.

    python experiments/bench/overhead.py [--steps 600] [--model small]
    python experiments/bench/overhead.py --smoke   # seconds: tiny, 2 workers, in-process,
                                                   # plain and sync only, nothing written

Trains the same model, batch and total number of local steps three ways, in
one invocation, on this machine:

  plain       one process, a plain AdamW loop over the same packed sequences
              (torch's default threads: every core)
  fedlm sync  `fedlm run`, 4 workers, DiLoCo, Flower simulation engine
  fedlm async `fedlm run`, 4 workers, delayed Nesterov

and reports tokens per second of each and the ratio fedlm / plain, both end to
end (the whole command: Ray start, corpus load, evaluation) and over the
training span (first to last evaluation, from the run store). Writes
experiments/results/overhead.json.

``--smoke`` (the test suite's check) runs plain and fedlm sync at a tiny size
(tiny model, 2 workers, H = 2, batch 2 x 32; fedlm async's settings are only
loaded: one fresh process fewer) and writes nothing. Its fedlm run uses
``--backend inprocess`` (``--backend flower`` keeps Flower's simulation engine):
Ray's start alone would cost more than the whole smoke, and the same ``fedlm
run`` command on Flower has its own test (tests/test_flower_e2e.py).
"""

from __future__ import annotations

import argparse
import json
import os
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


def plain(model: str, steps: int, batch: int, seq_len: int) -> dict:
    cfg = config_load.load(None, [f"model={model}", f"data.seq_len={seq_len}"])
    corpus = data.load_corpus(cfg.data)
    net = model_lib.build(model, seq_len, seed=0)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.inner.lr, weight_decay=0.1,
                            betas=(0.9, 0.95))
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(steps):
        idx = rng.integers(0, len(corpus.train), size=batch)
        seqs = torch.from_numpy(corpus.train[idx].astype(np.int64))
        _, loss = net(seqs[:, :-1], seqs[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - t0
    tokens = steps * batch * seq_len
    return {"mode": "plain", "threads": torch.get_num_threads(), "steps": steps,
            "tokens": tokens, "train_s": seconds, "total_s": seconds,
            "tokens_per_s_train": tokens / seconds, "tokens_per_s_total": tokens / seconds}


def fedlm(label: str, sets: list[str], db: Path, backend: str = "flower",
          timeout: float | None = None) -> dict:
    cmd = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", backend, "--db", str(db)]
    for kv in sets:
        cmd += ["--set", kv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)  # this tree's fedlm
    if proc.returncode != 0:
        raise RuntimeError(f"{label}: fedlm run exited with {proc.returncode}:\n"
                           f"{proc.stderr[-2000:]}")
    total = time.perf_counter() - t0
    conn = sqlite3.connect(db)
    run_id = conn.execute("SELECT MAX(id) FROM runs").fetchone()[0]
    tokens, steps = conn.execute("SELECT SUM(tokens), SUM(local_steps) FROM updates"
                                 " WHERE run_id=?", (run_id,)).fetchone()
    w0, w1 = conn.execute("SELECT MIN(wall_time), MAX(wall_time) FROM metrics WHERE run_id=?",
                          (run_id,)).fetchone()
    return {"mode": label, "steps": steps, "tokens": tokens, "train_s": w1 - w0,
            "total_s": total, "tokens_per_s_train": tokens / (w1 - w0),
            "tokens_per_s_total": tokens / total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600, help="total local steps (all workers)")
    ap.add_argument("--model", default="small")
    ap.add_argument("--label", default="", help="tag stored with the results (e.g. before)")
    ap.add_argument("--extra", nargs="*", default=[], help="extra --set for the fedlm runs")
    ap.add_argument("--backend", choices=("flower", "inprocess"), default=None,
                    help="of the fedlm runs (default: flower; inprocess with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="the test suite's check: tiny, "
                    "2 workers, in-process, nothing written")
    args = ap.parse_args()
    batch, seq_len, workers, h = 8, 128, 4, 30
    timeout = None
    if args.smoke:
        batch, seq_len, workers, h, timeout = 2, 32, 2, 2, 300
        args.steps, args.model = 2 * workers * h, "tiny"
    args.backend = args.backend or ("inprocess" if args.smoke else "flower")
    rounds = max(1, args.steps // (workers * h))
    steps = rounds * workers * h
    common = [f"model={args.model}", f"workers={workers}", f"inner.steps={h}",
              f"inner.batch_size={batch}", f"data.seq_len={seq_len}", "profile=homogeneous",
              f"eval.every={rounds}", *args.extra]
    rows = [plain(args.model, steps, batch, seq_len)]
    print(rows[-1], flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(fedlm("fedlm sync (diloco)", [*common, "strategy=diloco",
                                                  f"updates={rounds}"], Path(tmp) / "s.db",
                          args.backend, timeout))
        print(rows[-1], flush=True)
        async_sets = [*common, "strategy=delayed-nesterov", f"updates={steps // h}",
                      f"eval.every={steps // h}"]
        if args.smoke:
            config_load.load(None, async_sets)
        else:
            rows.append(fedlm("fedlm async (delayed-nesterov)", async_sets, Path(tmp) / "a.db",
                              args.backend, timeout))
            print(rows[-1], flush=True)
    base = rows[0]["tokens_per_s_train"]
    for r in rows:
        r["ratio_train"] = r["tokens_per_s_train"] / base
        r["ratio_total"] = r["tokens_per_s_total"] / base
    print(f"\n{args.steps} local steps, {args.model} model, batch {batch}x{seq_len}, "
          f"{os.cpu_count()} cores, fedlm on the {args.backend} backend")
    print(f"{'mode':>32} {'tok/s (train)':>14} {'ratio':>6} {'tok/s (total)':>14} {'ratio':>6}")
    for r in rows:
        print(f"{r['mode']:>32} {r['tokens_per_s_train']:>14,.0f} {r['ratio_train']:>6.2f} "
              f"{r['tokens_per_s_total']:>14,.0f} {r['ratio_total']:>6.2f}")
    if args.smoke:
        text = json.dumps({"machine": f"{os.cpu_count()} cores", "rows": rows}, indent=2)
        print(f"smoke: nothing written ({len(text)} bytes of JSON)")
        return
    out = ROOT / "experiments" / "results" / "overhead.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    previous[args.label or "latest"] = {"machine": f"{os.cpu_count()} cores", "rows": rows}
    out.write_text(json.dumps(previous, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
