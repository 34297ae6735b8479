"""Bytes on the wire per job, for each model preset.

    python experiments/bench/wire_size.py
    python experiments/bench/wire_size.py --smoke   # the tiny preset only, nothing written

Builds the real message contents fedlm sends — the TRAIN message's (global
model + job config) and the reply's (outer gradient + metrics) — and counts
the bytes of every object Flower transfers for them (``get_all_nested_objects``
+ ``deflate``: what the SuperLink stores and ships; the message envelope adds
a few hundred bytes more). fp32 throughout. Prints a
table; writes experiments/results/wire_size.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict  # noqa: E402
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402

import torch  # noqa: E402

from fedlm import config_load, model as model_lib  # noqa: E402
from fedlm.params import num_bytes  # noqa: E402
from fedlm.model import snapshot  # noqa: E402


def wire_bytes(content: RecordDict) -> int:
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(content).values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true",
                    help="the tiny preset only; print, write nothing (the test suite's check)")
    args = ap.parse_args()
    cfg_json = config_load.load().to_json()
    rows = []
    for preset in (["tiny"] if args.smoke else model_lib.PRESETS):
        # Dense random values, as trained weights and outer gradients are: Flower
        # content-addresses chunks, so a fresh model's constant tensors (LayerNorm
        # weights of 1) would be sent once and flatter the numbers.
        gen = torch.Generator().manual_seed(0)
        params = {k: torch.randn(v.shape, generator=gen)
                  for k, v in snapshot(model_lib.build(preset, 128, seed=0)).items()}
        down = RecordDict({
            "arrays": ArrayRecord(torch_state_dict=params),
            "job": ConfigRecord({"job-id": 0, "worker": 0, "base-version": 0, "local-steps": 30,
                                 "data-seed": 1, "config": cfg_json})})
        up = RecordDict({
            "arrays": ArrayRecord(torch_state_dict=params),  # the outer gradient: same shapes
            "metrics": MetricRecord({"steps": 30, "tokens": 30720, "train-loss": 1.0,
                                     "compute-seconds": 1.0, "num-examples": 240}),
            "job": ConfigRecord({"job-id": 0})})
        rows.append({"preset": preset, "parameters": sum(t.numel() for t in params.values()),
                     "tensor_bytes": num_bytes(params), "down_bytes": wire_bytes(down),
                     "up_bytes": wire_bytes(up)})
        r = rows[-1]
        r["overhead_pct"] = round(100 * (r["down_bytes"] + r["up_bytes"]
                                         - 2 * r["tensor_bytes"]) / (2 * r["tensor_bytes"]), 3)
    print(f"{'preset':>6} {'parameters':>12} {'fp32 bytes':>12} {'down/job':>12} "
          f"{'up/job':>12} {'framing %':>10}")
    for r in rows:
        print(f"{r['preset']:>6} {r['parameters']:>12,} {r['tensor_bytes']:>12,} "
              f"{r['down_bytes']:>12,} {r['up_bytes']:>12,} {r['overhead_pct']:>10.3f}")
    text = json.dumps({"rows": rows}, indent=2)
    if args.smoke:
        print(f"smoke: nothing written ({len(text)} bytes of JSON)")
        return
    out = ROOT / "experiments" / "results" / "wire_size.json"
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
