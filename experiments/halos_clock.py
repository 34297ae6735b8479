"""An outside clock: HALoS's simulator's round times beside fedlm's, on HALoS's fleet.

HALoS's public simulator (utnslab/halos, commit 4b5bf73, ``src/halos/simulation/``)
times a synchronous DiLoCo round as the slowest worker's compute plus one ring
all-reduce of the fp32 model; its "DiLoCo + DynUpd" arm is the same round with each
worker's local steps scaled to its speed. This script computes, for HALoS's own fleet
and settings (``examples/env.yaml``, ``examples/pythia_70m_commons.sh``,
``examples/run_diloco.sh``, ``examples/run_diloco_dynupd.sh``):

(a) HALoS's round times, by HALoS's formulas (re-implemented here, each line citing
    the upstream file and line it follows);
(b) fedlm's round times for the same arms, by fedlm's own timing code: the config
    ``workers = 16, fleet.preset = "halos", network.topology = "ring"`` loaded and
    checked as ``fedlm run`` loads it, each worker's first-round job sized by the run's
    local-steps policy (``fedlm.sim.job_sizes.first_jobs``) and timed by the
    simulator's ``JobTimer`` (a sync round ends with its slowest job: compute plus the
    all-reduce), and, for fixed H, also by ``fedlm plan``'s cost model
    (``fedlm.plan.topology.plan_topology``).

No training runs: the model is only a byte count (Pythia-70M's parameters, fp32), and
jitter is 0 (HALoS has none). ``python3 experiments/halos_clock.py`` prints the table;
``--write`` also writes experiments/results/halos_clock.json (docs/far_workers.md,
"An outside clock"; tests/test_halos_clock.py checks both against this code).
"""

from __future__ import annotations

import argparse
import json
import math
from itertools import permutations
from pathlib import Path

from fedlm.config_load import from_dict
from fedlm.plan.inputs import from_config
from fedlm.plan.topology import plan_topology
from fedlm.sim import fleet as fleet_lib, geo, job_sizes
from fedlm.sim.links import GBIT

OUT = Path(__file__).resolve().parent / "results" / "halos_clock.json"
HALOS_COMMIT = "4b5bf73768c1e039bd1f64c3a310025119f05e20"

# --- HALoS's settings -------------------------------------------------------------
# examples/env.yaml:1-15: four regions, Gbit/s between them (100 inside one), and four
# workers per region with relative speeds; fedlm's copy of the same numbers is
# fedlm/sim/geo.py's HALOS_GBIT and HALOS_SPEEDS (checked equal below).
HALOS_BANDWIDTHS = [[100.0, 0.537, 0.935, 0.202],
                    [0.537, 100.0, 0.386, 0.117],
                    [0.935, 0.386, 100.0, 0.127],
                    [0.202, 0.117, 0.127, 100.0]]
HALOS_WORKER_SPEEDS = [[0.232, 0.907, 0.828, 0.347],
                       [0.574, 0.531, 0.722, 0.194],
                       [0.852, 0.132, 0.896, 0.107],
                       [0.827, 0.515, 0.527, 0.788]]
LOCAL_STEP_TIME_MS = 238.391  # examples/pythia_70m_commons.sh:17, a speed-1.0 worker's step
NUM_LOCAL_STEPS = 32  # examples/run_diloco.sh:11 and run_diloco_dynupd.sh:11 (H)


def pythia_70m_params() -> int:
    """Pythia-70M's parameters (EleutherAI/pythia-70m-deduped, GPT-NeoX: 6 layers,
    d = 512, MLP 2048, vocabulary 50,304, untied input and output embeddings): the
    model HALoS loads (pythia_70m_commons.sh:9; model.py:5-17, fp32 by default)."""
    d, ff, layers, vocab = 512, 2048, 6, 50304
    block = (2 * 2 * d  # two LayerNorms, weight and bias
             + d * 3 * d + 3 * d  # query_key_value
             + d * d + d  # attention output
             + d * ff + ff + ff * d + d)  # MLP up, down
    return 2 * vocab * d + layers * block + 2 * d  # embed_in, embed_out, final LayerNorm


# --- (a) HALoS's formulas -----------------------------------------------------------

def halos_worker_speeds() -> list[float]:
    # common.py:442-447: the regions' speeds in order, divided by the fastest
    flat = [s for region in HALOS_WORKER_SPEEDS for s in region]
    return [s / max(flat) for s in flat]


def halos_local_steps(speeds: list[float], rescale: bool) -> list[int]:
    # common.py:506-513: --rescale_num_local_steps (DynUpd) gives max(1, ceil(H * speed))
    return [max(1, math.ceil(NUM_LOCAL_STEPS * s)) if rescale else NUM_LOCAL_STEPS
            for s in speeds]


def halos_compute_ms(steps: int, speed: float) -> float:
    # utils.py:52-53 get_compute_time_ms
    return LOCAL_STEP_TIME_MS * steps / speed


def halos_ring_gbps(bandwidths: list[list[float]]) -> float:
    # utils.py:22-41: over every ordering of the regions as a ring, its slowest link;
    # the fastest of those
    n = len(bandwidths)
    return max(min(bandwidths[p[i]][p[(i + 1) % n]] for i in range(n))
               for p in permutations(range(n)))


def halos_a2a_ms(comm_bytes: int, num_workers: int, gbps: float) -> float:
    # utils.py:46-50 get_a2a_comm_time_ms: a ring all-reduce among the workers, every
    # step at the one bandwidth
    if num_workers == 1:
        return 0.0
    return (2 * (num_workers - 1) * (comm_bytes * 8 / num_workers)) / (gbps * 1e9) * 1e3


def halos_round(rescale: bool) -> dict:
    """exec_diloco.py:62-73: the round is the slowest worker's compute (62-69) plus one
    all-reduce of the model's bytes (70: element_size x numel, fp32) among all workers
    (72: len(worker_handles) = 16) at the best ring's bottleneck (71)."""
    speeds = halos_worker_speeds()
    steps = halos_local_steps(speeds, rescale)
    compute = max(halos_compute_ms(k, s) for k, s in zip(steps, speeds)) / 1e3
    gbps = halos_ring_gbps(HALOS_BANDWIDTHS)
    comm = halos_a2a_ms(4 * pythia_70m_params(), len(speeds), gbps) / 1e3
    return {"steps": steps, "compute_s": compute, "comm_s": comm, "ring_gbit": gbps,
            "round_s": compute + comm}


# --- (b) fedlm's clock --------------------------------------------------------------

def fedlm_config(strategy: str, matrix: dict | None = None):
    """HALoS's fleet as a fedlm run config: 16 workers, four per region at HALoS's
    speeds (the fastest at 238.391 ms a step), no jitter, H = 32, a ring all-reduce.
    ``matrix``: the same network given as ``fleet.matrix`` instead of the preset's."""
    fleet = {"preset": "halos", "base_step_time": LOCAL_STEP_TIME_MS / 1e3, "jitter": 0.0}
    if matrix:
        fleet["matrix"] = matrix
        fleet["topology"] = {name: 4 for name in geo.HALOS_REGIONS}
    return from_dict({"strategy": strategy, "workers": 16, "model": "tiny",
                      "inner": {"steps": NUM_LOCAL_STEPS}, "fleet": fleet,
                      "network": {"topology": "ring"}})


def server_in(region: str) -> dict:
    """HALoS's matrix with ``region`` first: fedlm's server (the matrix's first region)
    sits there, and every region's link is its row and column of that region."""
    order = [region] + [r for r in geo.HALOS_REGIONS if r != region]
    idx = [geo.HALOS_REGIONS.index(r) for r in order]
    return {"regions": order, "gbit": [[HALOS_BANDWIDTHS[i][j] for j in idx] for i in idx]}


def fedlm_round(cfg, params: int) -> dict:
    """A sync round on fedlm's virtual clock: every worker's first job (its policy's
    steps) timed by the simulator's JobTimer, the round ending with the slowest."""
    profiles = fleet_lib.node_profiles(cfg)
    timer = fleet_lib.JobTimer(profiles, cfg.seed, cfg.network.intra_bw, cfg.network.topology)
    steps = job_sizes.first_jobs(cfg)
    nbytes = 4 * params  # fp32 both ways (network.compression = fp32)
    jobs = [timer.timing(w, k, nbytes, nbytes) for w, k in enumerate(steps)]
    compute = max(j.compute for j in jobs)
    exchange = jobs[0].exchange
    assert all(j.exchange == exchange for j in jobs)  # one all-reduce for all
    out = {"steps": steps, "compute_s": compute, "comm_s": exchange,
           "ring_gbit": timer._bw_min / GBIT, "latency_s": timer._lat_max,
           "round_s": max(j.total for j in jobs)}
    if cfg.local_steps == "fixed":  # the planner has one H for every node
        out["plan_round_s"] = plan_topology(from_config(cfg, params)).time_per_round
    return out


ARMS = (("DiLoCo", "diloco", False), ("DiLoCo + DynUpd", "diloco-dylu", True))


def results() -> dict:
    assert geo.HALOS_GBIT == HALOS_BANDWIDTHS and geo.HALOS_SPEEDS == HALOS_WORKER_SPEEDS
    params = pythia_70m_params()
    rows = []
    for arm, strategy, rescale in ARMS:
        theirs = halos_round(rescale)
        for fleet_name, matrix in (("preset halos (server in h0)", None),
                                   ("fleet.matrix, server in h2", server_in("h2"))):
            ours = fedlm_round(fedlm_config(strategy, matrix), params)
            rows.append({"arm": arm, "fedlm_fleet": fleet_name, "fedlm_strategy": strategy,
                         "halos": theirs, "fedlm": ours,
                         "ratio": ours["round_s"] / theirs["round_s"]})
    return {"halos_commit": HALOS_COMMIT, "params": params, "model_bytes": 4 * params,
            "local_step_time_s": LOCAL_STEP_TIME_MS / 1e3, "H": NUM_LOCAL_STEPS,
            "workers": 16, "rows": rows}


def table(res: dict) -> str:
    lines = [f"{'arm':<16} {'fedlm fleet':<28} {'HALoS s/round':>13} {'fedlm s/round':>13} "
             f"{'ratio':>6}   (compute + comm, s; ring Gbit/s)"]
    for r in res["rows"]:
        h, f = r["halos"], r["fedlm"]
        lines.append(f"{r['arm']:<16} {r['fedlm_fleet']:<28} {h['round_s']:>13.2f} "
                     f"{f['round_s']:>13.2f} {r['ratio']:>6.3f}   HALoS {h['compute_s']:.2f}"
                     f" + {h['comm_s']:.2f} @ {h['ring_gbit']:g}; fedlm {f['compute_s']:.2f}"
                     f" + {f['comm_s']:.2f} @ {f['ring_gbit']:g}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"also write {OUT}")
    args = ap.parse_args(argv)
    res = results()
    print(table(res))
    if args.write:
        OUT.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
