"""The plan against the simulator: fedlm's real engine, timed on its virtual clock.

``simulate`` runs ``fedlm.engine.Engine`` on a config with a transport that answers
every job at once with a zero update (``fedlm.engine.dry_run``), so only the
virtual clock matters, and reads back what the plan predicts: time per global update and
the shares of compute, communication and idle time. ``CASES`` are small
configurations from light to heavy communication (run by tests/test_plan.py);
``validation_rows`` and ``validation_table`` give docs/scaling.md's table
(``python -m fedlm.plan.plots``).

The only part of ``fedlm.plan`` that runs the engine (and so torch): import it
where it is used, not from ``fedlm.plan``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from fedlm import config_load
from fedlm.engine.dry_run import run_clock
from fedlm.plan.inputs import from_config
from fedlm.plan.model import predict
from fedlm.plan.topology import is_plain, plan_topology
from fedlm.sim import fleet
from fedlm.store.schema import EXPOSED_COMM_KINDS
from fedlm.strategies.fragments import Streaming


def simulate(cfg, params: int) -> dict[str, float]:
    """``run_clock`` with a model of ``params`` fp32 values (one tensor, or one per
    fragment when streaming). Returns what the plan predicts: virtual seconds per new
    global model, and the shares of all workers' time spent computing, communicating
    (link waits included) and idle.
    """
    stream = Streaming.of_config(cfg)
    if stream is None:
        zeros = OrderedDict(w=torch.zeros(int(params)))
    else:  # one tensor per fragment, as blocks of layers (fedlm.strategies.fragments)
        p = stream.fragments
        zeros = OrderedDict((f"blocks.{i}.w", torch.zeros(int(params) // p)) for i in range(p))
    engine, sec = run_clock(cfg, zeros)
    total = engine.now * len(fleet.node_profiles(cfg))
    comm = sum(sec.get(k, 0.0) for k in EXPOSED_COMM_KINDS)
    return {"time_per_update": engine.now / engine.version, "virtual_time": engine.now,
            "updates": engine.version, "compute_utilisation": sec.get("compute", 0.0) / total,
            "comm_fraction": comm / total, "idle_fraction": sec.get("idle", 0.0) / total}


# ---------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------

# Links slow enough that a few thousand fp32 values take seconds: the engine
# then moves tiny tensors while the virtual clock sees the same ratios of
# transfer to compute time as a large model on a fast link.
LINKS = ("fleet.links={near = {latency = 0.02, down_bw = 2e4, up_bw = 1e4}, "
         "mid = {latency = 0.05, down_bw = 1e4, up_bw = 5e3}, "
         "far = {latency = 0.1, down_bw = 5e3, up_bw = 2e3}}")
HOM = "fleet.step_times=[1.0, 1.0, 1.0, 1.0]"
HET = "fleet.step_times=[1.0, 1.5, 2.0, 3.0]"
ONE = "fleet.regions=['mid', 'mid', 'mid', 'mid']"
THREE = "fleet.regions=['near', 'mid', 'far', 'near']"

# name, overrides, parameters (fp32 values of the model): 4 workers, H = 5
# unless the overrides say otherwise; communication is 5% to 70% of the time.
CASES: list[tuple[str, list[str], int]] = [
    ("4 alike, 1 region", [HOM, ONE], 2_500),
    ("4 alike, 1 region, comm-heavy", [HOM, ONE], 10_000),
    ("step times 1-3 s, 1 region", [HET, ONE], 2_500),
    ("step times 1-3 s, 3 regions, small model", [HET, THREE], 500),
    ("step times 1-3 s, 3 regions, big model", [HET, THREE], 10_000),
    ("3 regions as 3 pods of 2 (hierarchical)",
     ["workers=6", "fleet.topology={near = 2, mid = 2, far = 2}", "network.hierarchical=true",
      "network.intra_bw=1e6"], 2_500),
    ("jitter 0.2, step times 1-3 s, 3 regions", [HET, THREE, "fleet.jitter=0.2"], 2_500),
    ("4 alike, shared server link", [HOM, ONE, "network.server_up=1e4",
                                     "network.server_down=2e4"], 2_500),
    ("step times 1-3 s, 3 regions, shared link", [HET, THREE, "network.server_up=1e4",
                                                  "network.server_down=2e4"], 2_500),
    ("8 workers (moderate), 3 regions, shared link",
     ["workers=8", "fleet.preset=moderate",
      "fleet.regions=['near','mid','far','near','mid','far','near','mid']",
      "network.server_up=1e4", "network.server_down=2e4"], 2_500),
    ("12 alike, jitter 0.2, shared link",
     ["workers=12", "fleet.preset=homogeneous", f"fleet.regions={['mid'] * 12}",
      "fleet.jitter=0.2", "network.server_up=2e4", "network.server_down=4e4"], 2_500),
    ("6 workers, 3 regions, shared uplink, int8",
     ["workers=6", "fleet.step_times=[1.0, 1.2, 1.4, 1.7, 2.0, 3.0]",
      "fleet.regions=['near','mid','far','near','mid','far']",
      "network.server_up=8e3", "network.compression=int8"], 5_000),
    ("step times 1-3 s, 3 regions, shared uplink, int4",
     [HET, THREE, "network.server_up=5e3", "network.compression=int4"], 10_000),
    ("step times 1-3 s, 3 regions, shared link, bf16",
     [HET, THREE, "network.server_up=5e3", "network.server_down=1e4",
      "network.compression=bf16"], 5_000),
]
# Collective topologies and Streaming DiLoCo (synchronous only: fedavg). The planner's
# streaming segments are H/P steps of params/P values: H divisible by P here, and the
# model one tensor per fragment, as ``simulate`` builds it.
TOPOLOGY_CASES: list[tuple[str, list[str], int]] = [
    ("ring, 4 alike, 1 region", [HOM, ONE, "network.topology=ring"], 2_500),
    ("ring, step times 1-3 s, 3 regions", [HET, THREE, "network.topology=ring"], 2_500),
    ("ring, 8 workers, 3 regions, comm-heavy",
     ["workers=8", "fleet.preset=moderate", "network.topology=ring",
      "fleet.regions=['near','mid','far','near','mid','far','near','mid']"], 10_000),
    ("ring, jitter 0.2, 3 regions, int8",
     [HET, THREE, "network.topology=ring", "fleet.jitter=0.2", "network.compression=int8"],
     5_000),
    ("tree, 4 alike, 1 region", [HOM, ONE, "network.topology=tree"], 2_500),
    ("tree, 6 workers, 3 regions", ["workers=6", "fleet.step_times=[1.0, 1.2, 1.4, 1.7, 2.0, 3.0]",
                                    "fleet.regions=['near','mid','far','near','mid','far']",
                                    "network.topology=tree"], 2_500),
    ("streaming star, P 2, overlap 1, comm-heavy",
     [HOM, ONE, "model=small", "inner.steps=6", "stream.fragments=2", "stream.overlap=1"],
     10_000),
    ("streaming star, P 4, overlap 2, 3 regions",
     [HET, THREE, "model=small", "inner.steps=12", "stream.fragments=4", "stream.overlap=2"],
     5_000),
    ("streaming ring, P 2, overlap 2, 3 regions",
     [HET, THREE, "model=small", "inner.steps=6", "stream.fragments=2", "stream.overlap=2",
      "network.topology=ring"], 10_000),
    ("streaming ring, P 4, overlap 1, int4",
     [HOM, THREE, "model=small", "inner.steps=8", "stream.fragments=4", "stream.overlap=1",
      "network.topology=ring", "network.compression=int4"], 10_000),
    ("streaming tree, P 2, overlap 2", [HOM, ONE, "model=small", "inner.steps=6",
                                        "stream.fragments=2", "stream.overlap=2",
                                        "network.topology=tree"], 10_000),
    ("streaming star, P 2, no overlap", [HET, ONE, "model=small", "inner.steps=6",
                                         "stream.fragments=2"], 5_000),
]
# one virtual day under a daily bandwidth cycle: slower, so not in the test suite
DAILY = ("daily bandwidth cycle 50%, step times 1-3 s, 3 regions, shared uplink",
         [HET, THREE, "inner.steps=60", "network.server_up=1e4", "network.daily_amplitude=0.5"],
         50_000)


def case_config(overrides: list[str], strategy: str, updates: int):
    return config_load.load(None, ["model=tiny", "workers=4", "inner.steps=5",
                                   f"strategy={strategy}", "fleet.jitter=0",
                                   "eval.every=1000000000", "reliability.checkpoint_every=0",
                                   "reliability.deadline_factor=1000", LINKS, f"updates={updates}",
                                   *overrides])


def validate_case(name: str, overrides: list[str], params: int, strategy: str,
                  updates: int) -> dict:
    """Predicted vs simulated for one case and strategy (fedavg: sync; else async)."""
    cfg = case_config(overrides, strategy, updates)
    sim = simulate(cfg, params)
    mode = "sync" if strategy in ("fedavg", "diloco") else "async"
    inp = from_config(cfg, params)
    if is_plain(inp):
        pred = predict(inp)[mode]
        per_update = pred.time_per_update
    else:  # an all-reduce or streaming rounds: a version per fragment's round
        pred = plan_topology(inp)
        per_update = pred.time_per_update / inp.fragments
    return {"case": name, "strategy": strategy, "mode": mode, "params": params,
            "updates": sim["updates"],
            "predicted": per_update, "simulated": sim["time_per_update"],
            "error_pct": 100 * (per_update / sim["time_per_update"] - 1),
            "comm_predicted": pred.comm_fraction, "comm_simulated": sim["comm_fraction"],
            "util_predicted": pred.compute_utilisation,
            "util_simulated": sim["compute_utilisation"],
            "idle_predicted": pred.idle_fraction, "idle_simulated": sim["idle_fraction"]}


def updates_for(strategy: str, case: tuple) -> int:
    """Global updates to run: enough for the mean to settle. Sync: 20 rounds;
    async: 50 arrivals per node; 4x as many with jitter (workers drift apart
    slowly from their common start); a daily cycle: one virtual day."""
    name, overrides = case[0], case[1]
    if name.startswith("daily"):
        return 280 if strategy == "fedavg" else 1900
    inp = from_config(case_config(overrides, strategy, 1), 1)
    nodes = len(inp.workers_per_dc)
    k = 4 if any(o.startswith("fleet.jitter=") and o != "fleet.jitter=0" for o in overrides) \
        else 1
    # streaming: updates count outer steps of P versions (and P - 1 flushing rounds end
    # the run, timed by their exchange alone): 20 outer steps dilute both ends
    return k * (20 if strategy == "fedavg" else 50 * nodes)


def validation_rows(cases=None) -> list[dict]:
    rows = []
    for case in cases or [*CASES, DAILY, *TOPOLOGY_CASES]:
        # an all-reduce and streaming rounds are synchronous only
        for strategy in ("fedavg",) if case in TOPOLOGY_CASES else ("fedavg", "async-sgd"):
            rows.append(validate_case(case[0], case[1], case[2], strategy,
                                      updates_for(strategy, case)))
    return rows


def validation_table(rows: list[dict]) -> str:
    header = ("| case | strategy | plan s/update | simulated | error | comm (plan / sim) | "
              "idle (plan / sim) |")
    lines = [header, "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['strategy']} | {r['predicted']:.3f} | "
                     f"{r['simulated']:.3f} | {r['error_pct']:+.1f}% | "
                     f"{r['comm_predicted']:.0%} / {r['comm_simulated']:.0%} | "
                     f"{r['idle_predicted']:.0%} / {r['idle_simulated']:.0%} |")
    return "\n".join(lines)
