"""The dashboard's headline tiles for the run in focus: progress, quality, cost and how
it stands against its fleet's bound, four to a row, each number short enough for a
metric tile ("591 MB", "2.46 M"). Shaped by ``dashboard.queries.headline``."""

from __future__ import annotations

import streamlit as st


def _short(n: float, units: tuple[tuple[str, float], ...], below: str) -> str:
    """Three significant digits and a unit ("591 MB", "2.46 M"): fits a metric tile."""
    for unit, size in units:
        if n >= size:
            value = n / size
            return f"{value:,.0f}{unit}" if value >= 100 else f"{value:.3g}{unit}"
    return below


def short_bytes(n: float) -> str:
    return _short(n, ((" GB", 1e9), (" MB", 1e6), (" kB", 1e3)), f"{n:,.0f} B")


def _count(n: int) -> str:
    return _short(n, ((" G", 1e9), (" M", 1e6)), f"{n:,}")


def _value(x, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def headline_row(h: dict) -> None:
    # rows of four (progress, quality, cost, against the fleet): seven or more to a row cut the
    # numbers off ("2,457…") at common window widths
    cols = st.columns(4)
    cols[0].metric("updates applied", f"{h['updates']:,}")
    cols[1].metric("virtual time", f"{h['virtual_time']:,.0f} s")
    cols[2].metric("tokens", _count(h["tokens"]), help=f"{h['tokens']:,} tokens trained on")
    cols[3].metric("straggler idle time", f"{h['idle']:,.0f} s")
    cols = st.columns(4)
    cols[0].metric("latest perplexity", _value(h["perplexity"], 2), help="per token")
    cols[1].metric("best perplexity", _value(h["best_perplexity"], 2), help="per token")
    per_byte = "per UTF-8 byte of the validation text: compares runs of different tokenizers"
    cols[2].metric("latest bits per byte", _value(h["bits_per_byte"], 3), help=per_byte)
    cols[3].metric("best bits per byte", _value(h["best_bits_per_byte"], 3), help=per_byte)
    cols = st.columns(4)
    cols[0].metric("idle fraction", f"{100 * h['idle_fraction']:.1f}%",
                   help="idle over present worker time (not drawn in a sampled round is "
                        "not present)")
    cols[1].metric("sent up", short_bytes(h["bytes_up"]),
                   help="bytes of the workers' updates on the wire (as encoded)")
    cols[2].metric("sent down", short_bytes(h["bytes_down"]), help="bytes of the model sent out")
    cols[3].metric("waiting for the link", f"{h['link_wait']:,.1f} s",
                   help="transfer time beyond each worker's own link: the shared server link")
    cols = st.columns(4)
    cols[0].metric("time over the fleet's bound", _value(h["bound_ratio"], 2) + "x"
                   if h["bound_ratio"] is not None else "-",
                   help=f"virtual time over the least its workers need for its steps "
                        f"({h['bound']:,.1f} s: each computing all the time but for one "
                        f"round trip)")
    cols[1].metric("goodput", f"{100 * h['goodput']:.1f}%",
                   help="compute of jobs whose updates arrived, over present worker time")
    cols[2].metric("compute never applied", f"{100 * h['unapplied']:.1f}%",
                   help="of present worker time: jobs lost when a worker left or failed, "
                        "dropped as late or stale, or still running at the end")
    cols[3].metric("communication", f"{100 * h['communication']:.1f}%",
                   help="of present worker time: transfers and exchanges a worker waited for")
    if h.get("not_drawn"):  # a sampled run: time left out of rounds is not present time
        st.caption(f"not drawn: {100 * h['not_drawn']:.1f}% of the workers' time there was "
                   f"left out of sampled rounds (free, not drawn in the round open); it is "
                   f"neither idle nor present time, so the idle fraction, goodput and the "
                   f"shares above leave it out")
