"""The scaling figures of a plan, and docs/scaling.md's numbers.

    fedlm plan ... --plot OUT_DIR            the two scaling plots of one plan
    python -m fedlm.plan.plots [--out DIR]   docs/scaling.md's figures, validation and numbers

The plots sweep a plan over model size (the plan as given and one change at a
time: compression, H, step time growing with the model, mixed links) and over
the number of data centres (own links, a shared server link, mixed links), and
draw time per round, communication, utilisation and idle time, sync beside
async. The second command writes ``scaling_model_size.png``,
``scaling_data_centres.png`` and ``scaling.json`` (the sweeps, the crossovers
and the plan-vs-simulator table of ``fedlm.plan.check``) under
experiments/results/ and prints the tables docs/scaling.md quotes.
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
from fedlm.sim.links import GBIT

ROOT = Path(__file__).resolve().parents[2]
SIZES = np.logspace(7, 14, 57)  # 10M .. 100T parameters
DATA_CENTRES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 100]


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
        from fedlm.plan.check import validation_rows, validation_table  # torch, the engine

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
