"""fedlm's live dashboard.

    fedlm dashboard [--db PATH]
    streamlit run dashboard/app.py -- --db PATH

Reads the run store read-only and re-reads it every two seconds (a Streamlit
fragment with ``run_every``), redrawing only when the database changed. Shows,
for the run in focus: headline numbers, a per-worker timeline of download /
compute / upload / idle / not drawn (a sampled run's workers left out of a round;
offline spans and lost jobs marked), workers ordered by number, the straggler
effect per worker, injected faults and failures, staleness; and for
any set of runs: validation perplexity (per token) or bits per byte (which compares
runs of different tokenizers) against virtual time, updates and tokens.
Runs that differ only in their seed (a sweep's ``--seeds``) can be compared as
one arm: their mean curve with a band from the lowest to the highest seed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `streamlit run` from a checkout
from fedlm.dashboard import queries as q  # noqa: E402
from fedlm.dashboard.headline import headline_row, short_bytes  # noqa: E402
from fedlm.dashboard.regions import region_section  # noqa: E402
from fedlm.dashboard.rounds import rounds_section  # noqa: E402
from fedlm.dashboard.curves import (MEASURES, group_label,  # noqa: E402
                                    perplexity_charts)
from fedlm.dashboard.worker_charts import (HIDDEN, timeline_chart, worker_charts,  # noqa: E402
                                           worker_label)
from fedlm.store import StoreError  # noqa: E402

REFRESH_SECONDS = 2


def db_from_argv() -> str:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--db", default=os.environ.get("FEDLM_DB", "runs/fedlm.db"))
    args, _ = parser.parse_known_args(sys.argv[1:])
    return args.db


# -- cached reads: keyed by the database's change marker -----------------------

@st.cache_data(ttl=600, max_entries=64, show_spinner=False)
def cached(name: str, db: str, marker: tuple, *args):
    return getattr(q, name)(db, *args)


def run_label(row) -> str:
    if row["status"] == "running":
        state = " (running)"
    elif row["status"] == "finished":
        state = ""
    else:
        state = f" ({row['status']})"
    name = row["name"] or row["strategy"]
    return f"#{row['id']} {name}{state}"


# -- page ------------------------------------------------------------------------

def chart_options():
    """Sidebar controls (outside the live fragment: fragments may not write there)."""
    st.sidebar.header("Charts")
    smoothing = st.sidebar.slider("smoothing", 0.0, 0.95, 0.0, 0.05, key="smoothing",
                                  help="exponential moving average of perplexity")
    log_scale = st.sidebar.checkbox("log-scale perplexity", value=True, key="log")
    measure = st.sidebar.radio("validation measure", list(MEASURES), key="measure",
                               format_func=MEASURES.get,
                               help="perplexity is per token: it compares runs of one "
                                    "tokenizer; bits per byte compares any")
    window = st.sidebar.number_input("timeline window (virtual s, 0 = whole run)",
                                     min_value=0.0, value=0.0, step=100.0, key="window")
    return smoothing, log_scale, window, measure


def run_pickers(runs: pd.DataFrame, groups: list[dict]):
    """Which run to focus on, which runs and which seed groups to compare; inside the
    fragment so new runs appear. The group picker shows only where runs differ in
    nothing but their seed."""
    labels = {int(r["id"]): run_label(r) for _, r in runs.iterrows()}
    ids = list(labels)
    left, right = st.columns([1, 2])
    focus = left.selectbox("run in focus", ids, index=len(ids) - 1, format_func=labels.get,
                           key="focus")
    compare = right.multiselect("compare perplexity of", ids, default=ids[-4:],
                                format_func=labels.get, key="compare")
    chosen = []
    if groups:
        by_key = {g["key"]: g for g in groups}
        keys = st.multiselect("compare seed groups (mean over seeds, band min–max)",
                              list(by_key), default=[], key="groups",
                              format_func=lambda k: group_label(by_key[k]),
                              help="finished runs whose configs differ only in seed, "
                                   "drawn as one arm")
        chosen = [by_key[k] for k in keys if k in by_key]
    return focus, compare, labels, chosen


@st.fragment(run_every=REFRESH_SECONDS)
def live(db: str, smoothing: float, log_scale: bool, window: float,
         measure: str = "perplexity") -> None:
    """The page: one run in focus (others compared on its curves), section by section."""
    marker = store_marker(db)
    if marker is None:
        return
    runs = cached("runs", db, marker)
    damaged = cached("damaged_runs", db, marker)
    for run_id, why in damaged.items():  # listed, never read
        st.warning(f"run {run_id} is damaged: {why}")
    if runs.empty:
        st.info(f"`{db}` holds no {'other ' if damaged else ''}runs yet; this page updates "
                f"by itself.")
        return
    focus, compare, labels, chosen = run_pickers(runs, cached("seed_groups", db, marker))
    run = runs.set_index("id").loc[focus]
    run_heading(run, focus, labels[focus])
    why = cached("damage", db, marker, focus)
    if why:  # its tables hold values of the wrong type: shown as damaged, not charted
        st.error(f"run {focus} is damaged: {why}")
        return
    headline_row(cached("headline", db, marker, focus))
    curves_section(db, marker, runs, focus, compare, labels, chosen,
                   (smoothing, log_scale, measure))
    timeline_section(db, marker, run, focus, window)
    straggler_section(cached("worker_totals", db, marker, focus))
    region_section(cached("regions", db, marker, focus))
    rounds_section(cached("rounds", db, marker, focus))
    shards_section(cached("shards", db, marker, focus))
    fails = cached("failures", db, marker, focus)
    failures_section(fails)
    left, right = st.columns(2)
    with left:
        staleness_section(cached("staleness", db, marker, focus))
    with right:
        config_section(db, marker, focus, expand_events=not fails.empty)


def store_marker(db: str):
    """The store's change marker, or None (and a line on the page) if there is no usable
    store yet."""
    if not Path(db).exists():
        st.info(f"No run database at `{db}` yet. Start a run with `fedlm run --db {db}`; "
                "this page picks it up by itself.")
        return None
    try:
        return q.change_marker(db)
    except StoreError as exc:  # not a run database, another schema version, locked
        st.error(str(exc))
        return None


def run_heading(run, focus: int, label: str) -> None:
    """The run's name, settings and, for one that did not finish, why."""
    live_note = ":green[**running** — refreshing every 2 s]" if run["status"] == "running" \
        else run["status"]
    st.subheader(label)
    st.caption(f"{run['strategy_summary'] or run['strategy']} · profile {run['profile']} · "
               f"model {run['model']} ({(run['num_parameters'] or 0):,} parameters) · "
               f"tokenizer {run['tokenizer']} · "
               f"{run['workers']} workers · local steps {run['local_steps']} · {live_note}")
    if run["status"] == "failed" and run["error"]:
        st.error(run["error"])
    if run["status"] == "diverged":  # stopped by eval.diverge_factor; the error says where
        st.error(f"Diverged: {run['error'] or 'no reason recorded'}")
    if run["status"] == "crashed":
        writer = (f"pid {int(run['owner_pid'])} on {run['owner_host']}"
                  if pd.notna(run["owner_pid"]) else "not recorded")
        st.warning(f"Crashed: the process writing this run ({writer}) is gone; last seen "
                   f"{run['last_seen']}. "
                   f"`fedlm run --resume {focus}` continues it from its newest checkpoint.")


def curves_section(db: str, marker, runs, focus: int, compare, labels, chosen,
                   view: tuple[float, bool, str]) -> None:
    """Validation perplexity (or bits per byte) of the run and those compared with it."""
    smoothing, log_scale, measure = view
    st.markdown(f"#### Validation {MEASURES[measure]}")
    grouped = [r for g in chosen for r in g["run_ids"]]
    shown = list(compare or ([] if chosen else [focus]))
    tokenizers = set(runs.set_index("id").loc[shown + grouped, "tokenizer"])
    if measure == "perplexity" and len(tokenizers) > 1:
        st.caption(f"These runs use different tokenizers ({', '.join(sorted(tokenizers))}): "
                   "perplexity is per token, so compare them by bits per byte (sidebar).")
    perplexity_charts(cached("metrics", db, marker, shown), labels, smoothing, log_scale,
                      chosen, cached("metrics", db, marker, grouped) if grouped else None,
                      measure)


def timeline_section(db: str, marker, run, focus: int, window: float) -> None:
    st.markdown("#### Per-worker timeline")
    vt = cached("headline", db, marker, focus)["virtual_time"]
    span = window if window > 0 else max(vt, 1.0)
    iv = cached("recent_intervals", db, marker, focus, span)
    if run["status"] == "running":
        iv = pd.concat([iv, cached("in_flight", db, marker, focus)], ignore_index=True)
    if iv.empty:
        st.info("No intervals yet.")
        return
    shown = f"last {span:,.0f} virtual s" if window > 0 else "whole run"
    st.caption(f"{shown}; {len(iv):,} intervals drawn (at most 5,000, newest first)")
    st.altair_chart(timeline_chart(iv), width="stretch")


def straggler_section(wt) -> None:
    """Idle time and updates per worker, charted and tabled."""
    st.markdown("#### The straggler effect")
    if wt.empty:
        return
    wt = wt.sort_values("worker")  # by number: worker 2 before worker 10
    worker_charts(wt)
    table = pd.DataFrame({
        "worker": wt["worker"].map(worker_label),
        "s/step": wt["step_time"].map("{:.2f}".format), "region": wt["region"],
        "updates": wt["updates"], "compute s": wt["compute"].map("{:,.1f}".format),
        "exposed comm s": (wt["download"] + wt["upload"] + wt["exchange"]
                           ).map("{:,.2f}".format),
        "hidden comm s": wt[HIDDEN].map("{:,.2f}".format),
        "link wait s": wt["link wait"].map("{:,.2f}".format),
        "sent up": wt["bytes_up"].map(short_bytes),
        "idle s": wt["idle"].map("{:,.1f}".format),
        "idle %": (100 * wt["idle_fraction"]).map("{:.1f}%".format)})
    if (wt["not drawn"] > 0).any():  # a sampled run: left out of rounds, not idle
        table["not drawn s"] = wt["not drawn"].map("{:,.1f}".format)
        st.caption("not drawn: free and there, but left out of the round open (client "
                   "sampling); neither idle nor present time, so out of idle % and goodput")
    st.table(table.set_index("worker"))


def shards_section(sh) -> None:
    if sh.empty:
        return
    st.markdown("#### Data shards")
    st.caption("what each shard was trained for, by how many workers (data.shard_choice), "
               "and where its schedule stands (inner.schedule = shard follows it)")
    st.table(pd.DataFrame({
        "shard": sh["shard"].map(lambda k: f"shard {int(k)}"), "jobs": sh["jobs"],
        "inner steps": sh["steps"], "workers": sh["workers"],
        "schedule position": sh["cursor"]}).set_index("shard"))


def failures_section(fails) -> None:
    st.markdown("#### Faults and failures")
    if fails.empty:
        st.caption("no injected faults, lost jobs, ignored replies or offline periods")
        return
    st.table(fails.assign(worker=fails["worker"].map(worker_label)).set_index("worker"))


def staleness_section(stl) -> None:
    st.markdown("#### Staleness of applied updates")
    if stl.empty or (stl["staleness"] == 0).all():
        st.caption(f"all {int(stl['updates'].sum())} updates were fresh (staleness 0)"
                   if not stl.empty else "no updates yet")
        return
    st.altair_chart(alt.Chart(stl).mark_bar().encode(
        x=alt.X("staleness:O", title="staleness (versions)", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("updates:Q", title="updates",
                axis=alt.Axis(tickMinStep=1, format="d"))).properties(height=200),
        width="stretch")


def config_section(db: str, marker, focus: int, expand_events: bool) -> None:
    """The run's metrics as CSV, its config and its events."""
    st.markdown("#### Config and data")
    m = cached("metrics", db, marker, [focus])
    st.download_button("metrics as CSV", m.to_csv(index=False).encode(),
                       file_name=f"run{focus}_metrics.csv", mime="text/csv",
                       key=f"csv-{focus}")
    with st.expander("config"):
        st.json(cached("run_config", db, marker, focus))
    ev = cached("events", db, marker, focus)
    if not ev.empty:
        with st.expander(f"events ({len(ev)})", expanded=expand_events):
            st.dataframe(ev, hide_index=True)


def main() -> None:
    st.set_page_config(page_title="fedlm", layout="wide")
    st.title("fedlm")
    db = st.sidebar.text_input("run database", value=db_from_argv(), key="db")
    live(db, *chart_options())


main()
