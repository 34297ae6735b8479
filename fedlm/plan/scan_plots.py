"""The two figures of ``fedlm plan --scan --plot DIR`` (the house style of ``plots``).

- ``scaling_topologies_bytes.png``: bytes per site per outer step against the
  number of data centres, one line per topology (and the star's server, dashed),
  at the model size of ``--params``;
- ``scaling_topologies_bandwidth.png``: the bandwidth each topology needs for
  communication to stay at or under 10%, against the model size, at the
  number of data centres of ``--data-centres``: whole (dashed) and streamed (solid).
"""

from __future__ import annotations

import math
from pathlib import Path

from fedlm.plan.inputs import PlanInput
from fedlm.plan.report import describe, human

COLORS = {"star": "C0", "ring": "C1", "tree": "C2", "hierarchical": "C3"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _nearest(values, want):
    return min(values, key=lambda v: abs(math.log(v) - math.log(want)))


def figures(inp: PlanInput, rows: list[dict], out: Path) -> list[Path]:
    import textwrap

    plt = _plt()
    title = "\n".join(textwrap.wrap(describe(inp).split(", ", 1)[1], 130))
    sizes = sorted({r["params"] for r in rows})
    dcs = sorted({r["data_centres"] for r in rows})
    size = _nearest(sizes, inp.params)
    d_at = _nearest(dcs, inp.data_centres)

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for top in COLORS:
        sel = [r for r in rows if r["topology"] == top and not r["streamed"]
               and r["params"] == size]
        if not sel:
            continue
        ax.plot([r["data_centres"] for r in sel], [r["bytes_per_site"] for r in sel], "o-",
                color=COLORS[top], label=f"{top}: per site")
        if top == "star":
            ax.plot([r["data_centres"] for r in sel], [r["bytes_total"] for r in sel], "o--",
                    color=COLORS[top], label="star: the server (all sites)")
    paths = [_save(fig, ax, "data centres D", "bytes per outer step",
                   f"Bytes per site per outer step, {human(size)} parameters\n{title}",
                   out / "scaling_topologies_bytes.png", legend=8)]

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for top in COLORS:
        for stream, style in ((False, "--"), (True, "-")):
            sel = [r for r in rows if r["topology"] == top and r["streamed"] == stream
                   and r["data_centres"] == d_at]
            if not sel:
                continue
            tag = (f"streamed P={sel[0]['fragments']}, τ={sel[0]['overlap']}" if stream
                   else "whole")
            ax.plot([r["params"] for r in sel], [8 * r["bandwidth_10pct"] for r in sel],
                    "o" + style, color=COLORS[top], label=f"{top}, {tag}")
    paths.append(_save(fig, ax, "model parameters P (step time ∝ P)",
                       "bandwidth on the slowest link for <= 10% communication (bit/s)",
                       f"Bandwidth for <= 10% communication, {d_at} data centres\n{title}",
                       out / "scaling_topologies_bandwidth.png", legend=7.5))
    return paths


def _save(fig, ax, xlabel: str, ylabel: str, title: str, path: Path, legend: float) -> Path:
    """Log-log axes, labels, grid, legend and title; written to ``path`` and closed."""
    import matplotlib.pyplot as plt

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=legend)
    ax.set_title(title, fontsize=7.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
