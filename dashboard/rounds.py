"""The dashboard's section for a sampled run (client sampling: each synchronous round
drawn from the workers available): per round, the workers drawn, kept, dropped after the
round closed (over-committed), cut by the deadline or lost, and the compute wasted.
Shaped by ``dashboard.queries.rounds``; nothing is drawn for a run that drew no round."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

OUTCOMES = ("kept", "dropped", "cut by deadline", "lost")


def rounds_section(data: pd.DataFrame | None) -> None:
    if data is None or data.empty:
        return
    st.markdown("#### Sampled rounds: drawn, kept, cut")
    long = data.melt(id_vars=["round"], value_vars=list(OUTCOMES), var_name="outcome",
                     value_name="workers")
    left, right = st.columns(2)
    with left:
        st.altair_chart(alt.Chart(long).mark_bar().encode(
            x=alt.X("round:O", title="round"),
            y=alt.Y("workers:Q", title="workers drawn", stack=True),
            color=alt.Color("outcome:N", sort=list(OUTCOMES), title="outcome")).properties(
            height=260, title="each round's drawn workers, by what became of them"),
            width="stretch")
    with right:
        st.altair_chart(alt.Chart(data).mark_bar().encode(
            x=alt.X("round:O", title="round"),
            y=alt.Y("wasted:Q", title="compute wasted (s)")).properties(
            height=260, title="compute of dropped and lost jobs"), width="stretch")
    st.caption(f"{len(data)} rounds; drawn {int(data['drawn'].sum())} of "
               f"{data['available'].mean():.1f} workers available on average; kept "
               f"{int(data['kept'].sum())}, dropped {int(data['dropped'].sum())}, cut by the "
               f"deadline {int(data['cut by deadline'].sum())}; "
               f"{data['wasted'].sum():,.1f} s of compute wasted")
