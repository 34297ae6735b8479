"""Figures of the experiments' reports, drawn off-screen (matplotlib is imported only
when a plot is made, so a report without plots needs none)."""

from __future__ import annotations

from pathlib import Path


def new_figure(size: tuple[float, float]):
    """A figure and its axes, drawn off-screen (matplotlib only when a plot is made)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=size)


def save(fig, ax, path: Path) -> None:
    """The legend, then the figure to ``path``, closed."""
    import matplotlib.pyplot as plt
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
