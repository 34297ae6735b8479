"""Device check for sim.devices (not part of the suite; docs/gpu.md): `python
experiments/gpu_placement_check.py` from the repository root on
a GPU host. Runs the same tiny async run (fp32, then auto precision) with the jobs on one
GPU (sim.devices=1), on all visible GPUs (sim.devices=0, when there are several), and on
cuda:0 named twice (two per-device pools on one GPU); prints the hashes and exits 1 when
an fp32 hash differs. Writes $OUT/placement-check.json when OUT is set."""
import json, os, sys, tempfile, time
sys.path.insert(0, os.getcwd())
import torch
from fedlm import config_load, store
from fedlm.runner import run_inprocess
from fedlm.worker import placement, precision

TINY = ["model=tiny", "workers=4", "updates=8", "inner.steps=4", "inner.batch_size=4",
        "inner.warmup_steps=2", "eval.every=4", "eval.batches=2", "eval.batch_size=8",
        "data.seq_len=64", "profile=moderate", "device=cuda", "strategy=delayed-nesterov",
        "local_steps=dylu"]
n = torch.cuda.device_count()
out = {"device_count": n, "name": torch.cuda.get_device_name(0), "torch": torch.__version__,
       "same_cuda_cuda0": precision.same_device("cuda", "cuda:0"), "runs": []}
arms = [("one", ["sim.devices=1"], None), ("named-twice", [], ["cuda:0", "cuda:0"])]
if n > 1:
    arms.insert(1, ("all", ["sim.devices=0"], None))
real, tmp = placement.devices, tempfile.mkdtemp()
for prec in ("fp32", "auto"):
    for label, sets, places in arms:
        cfg = config_load.load(None, [*TINY, f"inner.precision={prec}", *sets])
        placement.devices = real if places is None else (lambda cfg, p=places: list(p))
        db, t = os.path.join(tmp, f"{prec}-{label}.db"), time.time()
        run_inprocess(cfg, db)
        out["runs"].append({"precision": prec, "arm": label, "devices": placement.devices(cfg),
                            "hash": store.summarize(db, 1).final_hash,
                            "seconds": round(time.time() - t, 1)})
        print(out["runs"][-1], flush=True)
placement.devices = real
for prec in ("fp32", "auto"):
    out[f"one_hash_{prec}"] = len({r["hash"] for r in out["runs"] if r["precision"] == prec}) == 1
print(json.dumps({k: v for k, v in out.items() if k != "runs"}))
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "placement-check.json"), "w") as f:
        json.dump(out, f, indent=1)
sys.exit(0 if out["one_hash_fp32"] else 1)
