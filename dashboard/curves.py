"""The dashboard's validation curves: perplexity (per token) or bits per byte (which
compares runs of different tokenizers) of the runs and seed groups compared, against
virtual time, updates and tokens, smoothed on request.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from fedlm.sweep.uncertainty import band


def ema(values: pd.Series, alpha: float) -> pd.Series:
    return values if alpha <= 0 else values.ewm(alpha=1 - alpha, adjust=False).mean()


# the metrics column -> its name on the page
MEASURES = {"perplexity": "perplexity", "bits_per_byte": "bits per byte"}


BAND_NOTE = ("seed groups: the mean over seeds (each seed interpolated onto a common grid; "
             "past its end a seed keeps its final value), with a band from the lowest "
             "to the highest seed")


def group_label(group: dict) -> str:
    return f"{group['label']} (mean of {len(group['seeds'])}, band min–max)"


def group_band(gm: pd.DataFrame, group: dict, col: str, smoothing: float,
               measure: str = "perplexity") -> pd.DataFrame:
    """One seed group's curve against ``col``: the mean of its seeds' (smoothed)
    ``measure`` on a common grid, and the lowest and highest seed there."""
    curves = []
    for run_id in group["run_ids"]:
        one = gm[gm["run_id"] == run_id]
        if not one.empty:
            curves.append((one[col].to_numpy(float),
                           ema(one[measure], smoothing).to_numpy(float)))
    if not curves:
        return pd.DataFrame()
    b = band(curves)
    return pd.DataFrame({"run": group_label(group), col: b.x, "smoothed": b.mean,
                         "lowest seed": b.low, "highest seed": b.high})


def perplexity_charts(m: pd.DataFrame, labels: dict, smoothing: float, log_scale: bool,
                      groups: list[dict] = (), gm: pd.DataFrame | None = None,
                      measure: str = "perplexity"):
    """Validation ``measure`` (a metrics column: perplexity or bits_per_byte) of the
    runs in ``m`` and the seed groups, against virtual time, updates and tokens."""
    if m.empty and not groups:
        st.info("No evaluations yet.")
        return
    name = f"validation {MEASURES[measure]}"
    if not m.empty:
        m = m.assign(run=m["run_id"].map(labels))
        m["smoothed"] = m.groupby("run_id")[measure].transform(lambda s: ema(s, smoothing))
    # bits per byte is a log already: a log scale only bends it
    scale = alt.Scale(type="log") if log_scale and measure == "perplexity" \
        else alt.Scale(zero=False)
    tabs = st.tabs(["vs virtual time", "vs updates", "vs tokens"])
    for tab, (col, title) in zip(tabs, [("virtual_time", "virtual time (s)"),
                                        ("updates", "updates applied"), ("tokens", "tokens")]):
        bands = pd.concat([group_band(gm, g, col, smoothing, measure) for g in groups],
                          ignore_index=True) if groups else pd.DataFrame()
        x = alt.X(f"{col}:Q", title=title)
        color = alt.Color("run:N", scale=alt.Scale(scheme="category10"),
                          legend=alt.Legend(orient="bottom", title=None, columns=2,
                                            labelLimit=400))
        y = alt.Y("smoothed:Q", title=name, scale=scale)
        layers = []
        if not m.empty:
            layers.append(alt.Chart(m).mark_line(point=True).encode(
                x=x, y=y, color=color,
                tooltip=["run", col, alt.Tooltip("perplexity:Q", format=".3f"),
                         alt.Tooltip("bits_per_byte:Q", format=".3f")]))
        if not bands.empty:
            group_chart = alt.Chart(bands)
            layers.append(group_chart.mark_area(opacity=0.2).encode(
                x=x, y=alt.Y("lowest seed:Q", title=name, scale=scale),
                y2="highest seed:Q", color=color))
            layers.append(group_chart.mark_line(strokeWidth=2.5).encode(
                x=x, y=y, color=color,
                tooltip=["run", alt.Tooltip(f"{col}:Q", format=",.1f"),
                         alt.Tooltip("smoothed:Q", title="mean", format=".3f"),
                         alt.Tooltip("lowest seed:Q", format=".3f"),
                         alt.Tooltip("highest seed:Q", format=".3f")]))
        chart = layers[0] if len(layers) == 1 else alt.layer(*layers)
        tab.altair_chart(chart.properties(height=320), width="stretch")
        if groups:
            tab.caption(BAND_NOTE.capitalize() + ".")
