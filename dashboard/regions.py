"""The dashboard's section for a two-level run (``strategy = "halos"``): both levels.

Per region: its workers' idle time and staleness (in region versions), its pushes and
their staleness (in global versions), and what crossed its slow link; each region
server's version against the global version over virtual time; the traffic between
the region servers and the global server over virtual time. Shaped by
``dashboard.queries.regions``; nothing is drawn for other runs.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st


def region_section(data: dict[str, pd.DataFrame] | None) -> None:
    if data is None:
        return
    st.markdown("#### Regions: region servers and the global server")
    t = data["table"]
    st.table(pd.DataFrame({
        "region": t["region"], "workers": t["workers"], "updates": t["updates"],
        "idle %": t["idle %"].map("{:.1f}%".format),
        "update staleness": t["update staleness"].map("{:.2f}".format),
        "pushes": t["pushes"], "push staleness": t["push staleness"].map("{:.2f}".format),
        "sent to global": t["bytes up"].map("{:,}".format),
        "got from global": t["bytes down"].map("{:,}".format)}).set_index("region"))
    st.caption("staleness: a worker's update in its region server's versions since its job "
               "started; a push in global versions since its region last merged")
    left, right = st.columns(2)
    with left:
        st.altair_chart(alt.Chart(data["versions"]).mark_line(interpolate="step-after").encode(
            x=alt.X("t:Q", title="virtual time (s)"),
            y=alt.Y("version:Q", title="version"),
            color=alt.Color("region:N", title="server")).properties(
            height=260, title="region servers' versions and the global version"),
            width="stretch")
    with right:
        st.altair_chart(alt.Chart(data["traffic"]).mark_bar().encode(
            x=alt.X("t:Q", title="virtual time (s), when sent"),
            y=alt.Y("bytes:Q", title="bytes", stack=True),
            color=alt.Color("kind:N", title="transfer")).properties(
            height=260, title="traffic between regions and the global server"),
            width="stretch")
