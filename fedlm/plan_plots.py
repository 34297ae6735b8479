"""Plots and the simulator check of the cost model (``fedlm.plan``).

    fedlm plan ... --plot OUT_DIR          the two scaling plots of one plan
    python -m fedlm.plan_plots [--out DIR]  docs/scaling.md's figures, validation and numbers

The second writes ``scaling_model_size.png``, ``scaling_data_centres.png`` and
``scaling.json`` (the sweeps, the crossovers and the plan-vs-simulator table)
under experiments/results/ and prints the tables docs/scaling.md quotes.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from fedlm import plan
from fedlm.plan import PlanInput, Prediction

ROOT = Path(__file__).resolve().parents[1]
SIZES = np.logspace(7, 14, 57)  # 10M .. 100T parameters
DATA_CENTRES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 100]
GBIT = 1e9 / 8  # bytes/s in a Gbit/s


# ---------------------------------------------------------------------------
# Sweeps
# ---------------------------------------------------------------------------

def size_variants(inp: PlanInput) -> dict[str, PlanInput]:
    """What the model-size plot compares: the plan as given, then one change each."""
    out = {"as given": inp}
    if inp.compression != "fp32":
        out["fp32 upload"] = replace(inp, compression="fp32")
    out["int4 both ways"] = replace(inp, compression="int4", down_compression="int4")
    out[f"H = {10 * inp.H}"] = replace(inp, H=10 * inp.H)
    out["step time ∝ P"] = inp  # rescaled per size in sweep_sizes
    name, mixed = list(dc_scenarios(inp).items())[-1]
    out[name] = mixed  # stragglers on slow links and a shared server link
    return out


def sweep_sizes(inp: PlanInput, sizes=None) -> dict[str, dict[str, list[Prediction]]]:
    """variant -> mode -> predictions at each size. "step time ∝ P": the step
    time grows with the model (same data-centre compute per parameter), as
    given at ``inp.params``."""
    sizes = SIZES if sizes is None else sizes
    out: dict[str, dict[str, list[Prediction]]] = {}
    for name, base in size_variants(inp).items():
        out[name] = {"sync": [], "async": []}
        for p in sizes:
            v = replace(base, params=float(p))
            if name == "step time ∝ P":
                v = replace(v, step_time=tuple(s * p / inp.params for s in inp.step_time))
            for mode, pred in plan.predict(v).items():
                out[name][mode].append(pred)
    return out


def dc_scenarios(inp: PlanInput) -> dict[str, PlanInput]:
    """What the data-centre plot compares, all at ``inp``'s model size:

    - each DC on its own link, no shared bottleneck (the server unlimited);
    - the same behind the server's shared link (as given, or 10 x one DC's link);
    - mixed DCs: every second and third one on a link at 1/2 and 1/4 of the
      bandwidth with 2 and 3 x the latency, behind the same shared link.
    """
    server_down = inp.server_down or 10 * max(inp.down_bw)
    server_up = inp.server_up or 10 * max(inp.up_bw)
    shared = f"shared server link {plan.human(8 * server_up, 'bit/s')}"
    own = replace(inp, server_down=0.0, server_up=0.0)
    mixed = replace(inp, server_down=server_down, server_up=server_up,
                    down_bw=tuple(b * f for b in inp.down_bw[:1] for f in (1, 0.5, 0.25)),
                    up_bw=tuple(b * f for b in inp.up_bw[:1] for f in (1, 0.5, 0.25)),
                    latency=tuple(inp.latency[0] * f for f in (1, 2, 3)))
    return {"own links only": own,
            shared: replace(inp, server_down=server_down, server_up=server_up),
            "mixed links + " + shared: mixed}


def sweep_data_centres(inp: PlanInput, counts=None):
    counts = DATA_CENTRES if counts is None else counts
    out = {}
    for name, base in dc_scenarios(inp).items():
        out[name] = {"sync": [], "async": []}
        for d in counts:
            for mode, pred in plan.predict(replace(base, data_centres=d)).items():
                out[name][mode].append(pred)
    return out


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------

PANELS = [("time_per_round", "time per round: every node updates once (s)", True),
          ("comm_fraction", "communication fraction", False),
          ("compute_utilisation", "compute utilisation", False),
          ("idle_fraction", "idle fraction (waiting for others)", False)]


def _figure(x, sweeps, xlabel: str, title: str, path: Path, async_for: set[str],
            extra=None) -> Path:
    """A 2 x 2 figure (time per round, communication, utilisation, idle) against
    ``x`` (log axis): sync solid, async dashed (for the sweeps in ``async_for``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (field, label, logy) in zip(axes.flat, PANELS):
        for i, (name, modes) in enumerate(sweeps.items()):
            for mode, style in (("sync", "-"), ("async", "--")):
                if mode == "async" and name not in async_for:
                    continue
                ax.plot(x, [getattr(p, field) for p in modes[mode]], style,
                        color=colors[i % len(colors)], label=f"{name} ({mode})")
        ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        else:
            ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
        if extra is not None:
            extra(ax, field)
    axes.flat[0].legend(fontsize=7.5, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.07, top=0.91, wspace=0.2, hspace=0.25)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_model_size(inp: PlanInput, path: Path, sweeps=None) -> Path:
    sweeps = sweeps or sweep_sizes(inp)
    cross = plan.crossover_params(inp, "sync", 0.5)

    def marks(ax, field):
        if field == "time_per_round":  # compute alone, for reference
            comp = float(np.max(inp.classes().compute(inp.H, inp.jitter)[0]))
            ax.axhline(comp, color="grey", lw=0.8, ls=":")
            ax.text(SIZES[-1], comp * 0.75, "compute alone (H x step time)", fontsize=7,
                    color="grey", ha="right", va="top")
        if 0 < cross < math.inf:
            ax.axvline(cross, color="grey", lw=0.8, ls=":")

    title = f"Scaling with model size — {plan.describe(inp).split(', ', 1)[1]}"
    mixed = list(dc_scenarios(inp))[-1]
    return _figure(SIZES, sweeps, "model parameters P", _wrap(title), path, {"as given", mixed},
                   marks)


def plot_data_centres(inp: PlanInput, path: Path, sweeps=None) -> Path:
    sweeps = sweeps or sweep_data_centres(inp)
    title = (f"Scaling with the number of data centres — "
             f"{plan.describe(replace(inp, server_down=0.0, server_up=0.0))}")
    title = title.replace(f"{inp.data_centres} data centre(s)", "D data centres")
    title = title.replace("server link unlimited", "server link as in the legend")
    return _figure(DATA_CENTRES, sweeps, "data centres D", _wrap(title), path, set(sweeps))


def _wrap(text: str, width: int = 150) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def scaling_plots(inp: PlanInput, out_dir: Path) -> list[Path]:
    """The two scaling plots of a plan, as PNG files in ``out_dir``."""
    return [plot_model_size(inp, Path(out_dir) / "scaling_model_size.png"),
            plot_data_centres(inp, Path(out_dir) / "scaling_data_centres.png")]


# ---------------------------------------------------------------------------
# The plan against the simulator
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
# one virtual day under a daily bandwidth cycle: slower, so not in the test suite
DAILY = ("daily bandwidth cycle 50%, step times 1-3 s, 3 regions, shared uplink",
         [HET, THREE, "inner.steps=60", "network.server_up=1e4", "network.daily_amplitude=0.5"],
         50_000)


def case_config(overrides: list[str], strategy: str, updates: int):
    from fedlm import config

    return config.load(None, ["model=tiny", "workers=4", "inner.steps=5", f"strategy={strategy}",
                              "fleet.jitter=0", "eval.every=1000000000",
                              "reliability.checkpoint_every=0", "reliability.deadline_factor=1000", LINKS,
                              f"updates={updates}",
                              *overrides])


def validate_case(name: str, overrides: list[str], params: int, strategy: str,
                  updates: int) -> dict:
    """Predicted vs simulated for one case and strategy (fedavg: sync; else async)."""
    cfg = case_config(overrides, strategy, updates)
    sim = plan.simulate(cfg, params)
    mode = "sync" if strategy in ("fedavg", "diloco") else "async"
    pred = plan.predict(plan.from_config(cfg, params))[mode]
    return {"case": name, "strategy": strategy, "mode": mode, "params": params,
            "updates": sim["updates"],
            "predicted": pred.time_per_update, "simulated": sim["time_per_update"],
            "error_pct": 100 * (pred.time_per_update / sim["time_per_update"] - 1),
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
    nodes = len(plan.from_config(case_config(overrides, strategy, 1), 1).workers_per_dc)
    k = 4 if any(o.startswith("fleet.jitter=") and o != "fleet.jitter=0" for o in overrides) \
        else 1
    return k * (20 if strategy == "fedavg" else 50 * nodes)


def validation_rows(cases=None) -> list[dict]:
    rows = []
    for case in cases or [*CASES, DAILY]:
        for strategy in ("fedavg", "async-sgd"):
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


# ---------------------------------------------------------------------------
# docs/scaling.md's numbers
# ---------------------------------------------------------------------------

# The plan the docs use: the CLI example (fedlm plan --params 1e9 --workers 8
# --step-time 0.5 --H 100 --bandwidth 1e9 --latency 0.05 --compression int8).
# and fedlm's default compute jitter (fleet.jitter = 0.05)
DOCS_PLAN = PlanInput(params=1e9, data_centres=8, step_time=(0.5,), H=100, latency=(0.05,),
                      down_bw=(GBIT,), up_bw=(GBIT,), compression="int8", jitter=0.05)


def _pred(p: Prediction) -> dict:
    """The headline numbers of a prediction, 4 significant digits (for the JSON)."""
    keys = ("time_per_update", "time_per_round", "comm_fraction", "compute_utilisation",
            "idle_fraction")
    return {k: float(f"{getattr(p, k):.4g}") for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description="docs/scaling.md's figures and numbers")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    ap.add_argument("--no-validation", action="store_true", help="skip the simulator runs")
    args = ap.parse_args()
    out = Path(args.out)
    inp = DOCS_PLAN
    sizes = sweep_sizes(inp)
    dcs = sweep_data_centres(inp)
    paths = [plot_model_size(inp, out / "scaling_model_size.png", sizes),
             plot_data_centres(inp, out / "scaling_data_centres.png", dcs)]
    result: dict = {"plan": plan.input_dict(inp), "sizes": list(SIZES),
                    "data_centres": DATA_CENTRES,
                    "by_size": {v: {m: [_pred(p) for p in ps] for m, ps in modes.items()}
                                for v, modes in sizes.items()},
                    "by_data_centres": {v: {m: [_pred(p) for p in ps] for m, ps in modes.items()}
                                        for v, modes in dcs.items()}}
    # crossovers: the plan as given and one change at a time
    cross = {}
    variants = {k: v for k, v in size_variants(inp).items()
                if k != "step time ∝ P" and k not in dc_scenarios(inp)}
    for name, v in variants.items():
        cross[name] = {m: {"params_equal": plan.crossover_params(v, m, 0.5),
                           "params_10pct": plan.crossover_params(v, m, 0.1)}
                       for m in ("sync", "async")}
    for name, v in dc_scenarios(inp).items():
        for d in (8, 32, 100):
            key = f"{name}, D = {d}"
            vd = replace(v, data_centres=d)
            cross[key] = {m: {"params_equal": plan.crossover_params(vd, m, 0.5),
                              "params_10pct": plan.crossover_params(vd, m, 0.1)}
                          for m in ("sync", "async")}
    result["crossovers"] = cross
    print(plan.table(inp))
    print("\ncrossovers (communication = compute; <= 10%):")
    for name, modes in cross.items():
        print(f"  {name:55s} " + "  ".join(
            f"{m}: {plan.human(c['params_equal'])} / {plan.human(c['params_10pct'])}"
            for m, c in modes.items()))
    print("\nby data centres (sync util / async util, time per round sync / async):")
    for name, modes in dcs.items():
        for d, s, a in zip(DATA_CENTRES, modes["sync"], modes["async"]):
            print(f"  {name:40s} D={d:>3}: util {s.compute_utilisation:6.1%} / "
                  f"{a.compute_utilisation:6.1%}  round {plan.seconds(s.time_per_round):>9} / "
                  f"{plan.seconds(a.time_per_round):>9}  idle {s.idle_fraction:5.1%}")
    if not args.no_validation:
        rows = validation_rows()
        result["validation"] = rows
        print("\n" + validation_table(rows))
        print(f"\nmax |error| {max(abs(r['error_pct']) for r in rows):.2f}%")
    (out / "scaling.json").write_text(json.dumps(plan.jsonable(result), default=float) + "\n")
    for p in [*paths, out / "scaling.json"]:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
