"""How a sweep report shows its numbers: a cell's estimate over seeds (mean ± the
half-width of its 95% interval, ``n`` where seeds are missing), seconds at the scale of
the cell's runs, a range of counts, and the words that say how to read them."""

from __future__ import annotations

from fedlm.sweep.uncertainty import Estimate, paired_estimate

Group = dict  # seed -> Cell: one arm on one profile, every seed that finished


def seconds_format(group: Group) -> str:
    """Whole seconds, unless this cell's runs are all shorter than 10 virtual s (a fast
    fleet or a scaled clock, which whole seconds would show as 0 or 1), per cell: one
    report may hold runs of 3 s and of 3,000 s."""
    longest = max((c.summary.virtual_time for c in group.values()), default=10)
    return ",.0f" if longest >= 10 else ".3f"


def shown(est: Estimate | None, fmt: str, seeded: bool, planned: int = 0,
          unit: str = "") -> str:
    """``est`` as a table cell. Without seeds, the value alone (as reports always
    were). With seeds: ``mean ± half-width`` of the 95% interval, the unit after
    both (``+6.7 ± 2.1%``); ``n=1: no interval`` where one seed finished;
    ``(n=k)`` where fewer seeds than ``planned`` finished."""
    if est is None:
        return "-"
    if not seeded:
        return f"{est.mean:{fmt}}{unit}"
    if est.half_width is None:
        return f"{est.mean:{fmt}}{unit} (n=1: no interval)"
    text = f"{est.mean:{fmt}} ± {est.half_width:{fmt.replace('+', '')}}{unit}"
    return text + (f" (n={est.n})" if est.n < planned else "")


def span(values: list[int]) -> str:
    """``low–high`` of ``values`` (one number where they agree)."""
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


SEEDED = ("each cell is run once per seed (an arm's own `seeds` are listed under Arms). A "
           "number is the mean over the seeds that finished ± the half-width of its 95% "
           "confidence interval (Student t, n − 1 degrees of freedom); n is given where "
           "fewer seeds finished than were planned, and one seed alone has no interval. "
           "Comparisons with the reference are paired: each seed against the reference's "
           "run of the same profile and seed, then the mean and interval of those "
           "differences (of ratios: their arithmetic mean).")
ONE_SEED = ("One run per cell (one seed): no intervals. `seeds = [0, 1, 2]` in the spec, or "
             "`--seeds N`, runs each cell over seeds and gives means with 95% intervals.")


def short_hash(cell) -> str:
    """`` (1a2b3c4d)``: the first 8 digits of a run's final weights' hash, if it has one."""
    digest = cell.summary.final_hash
    return f" ({digest[:8]})" if digest else ""


def final_gap(group: Group, reference: Group) -> Estimate | None:
    """``group``'s final perplexity against ``reference``'s, % paired by seed (None: no
    seed in common): the per-update gap of a report's table and of its frontier."""
    return paired_estimate({s: c.summary.final_perplexity for s, c in group.items()},
                           {s: c.summary.final_perplexity for s, c in reference.items()})
