"""The dashboard's per-worker charts: the timeline of what each worker did when
(download, compute, upload, idle, not drawn; a hidden exchange and slowed spans as thin
bars over it; offline and absent spans, lost jobs, jobs in flight), and each worker's
time by kind, idle fraction and updates applied, side by side.

Charts only, from frames ``dashboard.queries`` shaped: the page (``app.py``) reads the
store and places them. Apart because the colours of the kinds of time and the order of
the workers are one scheme that both charts share.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

KIND_COLORS = {"compute": "#2ca02c", "download": "#1f77b4", "upload": "#9467bd",
               "exchange": "#8c564b", "link wait": "#17becf", "idle": "#d62728",
               # client sampling: free and there, left out of the round open (not idle:
               # nobody waits for it; docs/sampling.md), a pale colour of its own
               "not drawn": "#e7cb94"}
# an exchange that ran behind compute (Streaming DiLoCo's overlap): drawn as a thin
# bar over the compute it overlapped, left out of the time totals
HIDDEN = "hidden exchange"
# a fleet that changes over time: a worker not there (before it joins, away, gone), and
# the spans it ran slowed, drawn as a thin bar over whatever it was doing
SLOWED = "slowed"
OVERLAYS = (HIDDEN, SLOWED)
TIMELINE_COLORS = {**KIND_COLORS, HIDDEN: "#e377c2", "in flight": "#bbbbbb",
                   "offline": "#444444", "absent": "#7f7f7f", SLOWED: "#bcbd22",
                   "lost job": "#ff7f0e"}


def worker_label(w) -> str:
    return f"worker {int(w)}"


def worker_order(workers) -> list[str]:
    """The workers' labels by number (worker 2 before worker 10), for a chart's ``sort``:
    a nominal axis would otherwise order them as text."""
    return [worker_label(w) for w in sorted({int(w) for w in workers})]


def timeline_chart(iv: pd.DataFrame) -> alt.Chart:
    order = worker_order(iv["worker"])
    iv = iv.assign(worker=iv["worker"].map(worker_label))
    over = iv["kind"].isin(OVERLAYS)
    chart = _timeline_bars(iv[~over], alt.Chart(iv[~over]).mark_bar(), order)
    if over.any():  # a thin bar over the compute it overlapped, or the slowed spans
        chart = chart + _timeline_bars(iv[over], alt.Chart(iv[over]).mark_bar(size=7), order)
    return chart.properties(height=alt.Step(32))  # 32 px per worker row


def _timeline_bars(iv: pd.DataFrame, chart: alt.Chart, order: list[str]) -> alt.Chart:
    return chart.encode(
        x=alt.X("t_start:Q", title="virtual time (s)"),
        x2="t_end:Q",
        y=alt.Y("worker:N", title=None, sort=order),
        color=alt.Color("kind:N", scale=alt.Scale(domain=list(TIMELINE_COLORS),
                                                  range=list(TIMELINE_COLORS.values())),
                        legend=alt.Legend(orient="top", title=None)),
        tooltip=["worker", "kind", alt.Tooltip("t_start:Q", format=".1f"),
                 alt.Tooltip("t_end:Q", format=".1f"), "version", "job_id",
                 alt.Tooltip("shard:Q", title="data shard"),
                 alt.Tooltip("cursor:Q", title="shard's steps before the job")],
    )


def worker_charts(wt: pd.DataFrame) -> None:
    order = worker_order(wt["worker"])
    wt = wt.assign(label=wt["worker"].map(worker_label))
    left, mid, right = st.columns(3)
    stacked = wt.melt(id_vars=["label"], value_vars=list(KIND_COLORS), var_name="kind",
                      value_name="seconds")
    left.markdown("**Time per worker** (virtual s)")
    left.altair_chart(alt.Chart(stacked).mark_bar().encode(
        y=alt.Y("label:N", title=None, sort=order),
        x=alt.X("seconds:Q", title="virtual seconds"),
        color=alt.Color("kind:N", scale=alt.Scale(domain=list(KIND_COLORS),
                                                  range=list(KIND_COLORS.values())),
                        legend=None),
        tooltip=["label", "kind", alt.Tooltip("seconds:Q", format=".1f")]),
        width="stretch")
    mid.markdown("**Idle fraction per worker**")
    bars = alt.Chart(wt).encode(y=alt.Y("label:N", title=None, sort=order),
                                x=alt.X("idle_fraction:Q", title="idle fraction",
                                        axis=alt.Axis(format="%"),
                                        scale=alt.Scale(domain=[0, 1])))
    mid.altair_chart(bars.mark_bar(color=KIND_COLORS["idle"]) + bars.mark_text(
        align="left", dx=3).encode(text=alt.Text("idle_fraction:Q", format=".0%")),
        width="stretch")
    right.markdown("**Updates applied per worker**")
    right.altair_chart(alt.Chart(wt).mark_bar(color=KIND_COLORS["compute"]).encode(
        y=alt.Y("label:N", title=None, sort=order),
        x=alt.X("updates:Q", title="updates", axis=alt.Axis(tickMinStep=1, format="d")),
        tooltip=["label", "updates", "step_time", "region"]), width="stretch")
