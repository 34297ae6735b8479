"""The dashboard's data: the run store's rows, shaped for the page.

The rows come from ``fedlm.store.dashboard``, which opens the run database
read-only (``mode=ro``), so the dashboard never blocks — nor is blocked by — a
run that is writing, and aggregates heavy tables in SQL (per-worker totals with
GROUP BY; the Gantt chart reads only a recent window of intervals), so a run of
100k intervals stays fast. Here they become what the page shows: the status
readers show, per-worker tables, the timeline's spans. ``app.py`` caches each
of these functions, keyed by ``change_marker``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from fedlm.store.rounds import rounds as read_rounds
from fedlm.store.yardstick import yardstick
from fedlm.store import (config_of, last_seen, list_runs, region_transfers, shown_status,
                         tokenizer_of)
from fedlm.store.damage import damage as run_damage
from fedlm.store.schema import COUNTED_KINDS, PRESENT_KINDS, idle_fraction
from fedlm.store import dashboard as reads


def change_marker(db: str | Path) -> tuple:
    """Cheap fingerprint of the database's content. In WAL mode the main file's
    mtime does not move on commit, so count rows instead."""
    return reads.change_marker(db)


def damaged_runs(db: str | Path) -> dict[int, str]:
    """The runs whose row is damaged (a value of the wrong type, a config that is not
    JSON), each with what is wrong, as ``fedlm runs`` lists them: the page shows them
    in one line each and reads nothing else of theirs."""
    return {int(r["id"]): r["damaged"] for r in list_runs(db) if r["damaged"]}


def damage(db: str | Path, run_id: int) -> str | None:
    """What is damaged in the tables of run ``run_id`` (its metrics, intervals, ...), or
    None: the run in focus is read only if nothing is."""
    return run_damage(db, run_id)


def runs(db: str | Path) -> pd.DataFrame:
    """Every run but the damaged ones (``damaged_runs``); ``status`` is what readers show
    (``crashed``: its writer is gone), ``tokenizer`` its ``data.tokenizer``."""
    frame = reads.runs(db)
    frame = frame[~frame["id"].isin(list(damaged_runs(db)))].reset_index(drop=True)
    records = frame.astype(object).where(frame.notna(), None).to_dict("records")
    frame["status"] = [shown_status(r) for r in records]
    frame["last_seen"] = [last_seen(r) for r in records]
    frame["tokenizer"] = [tokenizer_of(r["config_json"]) for r in records]
    return frame.drop(columns="config_json")


# what a run's config may differ in and still be "the same run, another seed"
_NOT_THE_EXPERIMENT = ("seed", "name", "db")
_SEED_SUFFIX = re.compile(r" seed \d+$")  # how `fedlm sweep` names a run of a seed


def seed_groups(db: str | Path) -> list[dict]:
    """Finished runs that differ only in their seed (their configs are equal apart
    from ``seed``, ``name`` and ``db``), as groups of at least two seeds:
    ``{"key", "label", "run_ids", "seeds"}``, oldest group first. The newest
    finished run of each seed counts. ``key`` (the group's oldest run id) stays the
    same when more seeds finish; ``label`` is the runs' shared name without its
    `` seed S`` suffix (a sweep's ``ARM @ PROFILE``), else strategy and profile."""
    frame = reads.run_configs(db)
    members: dict[str, dict[int, dict]] = {}
    for row in frame[frame["status"] == "finished"].to_dict("records"):
        try:
            cfg = json.loads(row["config_json"])
        except (TypeError, ValueError):
            continue  # not a config we can compare: never grouped
        if not isinstance(cfg, dict):
            continue
        for key in _NOT_THE_EXPERIMENT:
            cfg.pop(key, None)
        members.setdefault(json.dumps(cfg, sort_keys=True), {})[int(row["seed"])] = row
    groups = []
    for by_seed in members.values():
        if len(by_seed) < 2:
            continue
        rows = [by_seed[s] for s in sorted(by_seed)]
        names = {_SEED_SUFFIX.sub("", r["name"] or "") for r in rows}
        base = names.pop() if len(names) == 1 and "" not in names else \
            f"{rows[0]['strategy']} · {rows[0]['profile']}"
        seeds = sorted(by_seed)
        groups.append({"key": min(int(r["id"]) for r in rows),
                       "label": f"{base} · seeds {', '.join(map(str, seeds))}",
                       "run_ids": [int(r["id"]) for r in rows], "seeds": seeds})
    return sorted(groups, key=lambda g: g["key"])


def run_config(db: str | Path, run_id: int) -> dict:
    try:
        return config_of(db, run_id)
    except KeyError:
        return {}


def headline(db: str | Path, run_id: int) -> dict:
    """The numbers at the top of the page for one run."""
    h = reads.headline_rows(db, run_id)
    r, spans = h["run"], h["spans"]
    return {"status": shown_status(r), "virtual_time": r["virtual_time"] or h["latest_time"],
            "updates": h["versions"], "jobs": h["jobs"], "tokens": h["tokens"],
            "perplexity": h["perplexity"], "best_perplexity": h["best_perplexity"],
            "bits_per_byte": h["bits_per_byte"], "best_bits_per_byte": h["best_bits_per_byte"],
            "idle": spans.get("idle", 0.0), "idle_fraction": idle_fraction(spans),
            "bytes_down": h["bytes_down"], "bytes_up": h["bytes_up"],
            "link_wait": spans.get("link wait", 0.0), **_yardstick(db, run_id, r)}


def _yardstick(db: str | Path, run_id: int, run) -> dict:
    """The run's time over its fleet's least time for its steps, its goodput and where
    the rest of present worker time went (fedlm.store.yardstick); no ratio on the wall
    clock or before a step arrived."""
    y = yardstick(db, run_id)
    ratio = y.ratio if run["clock"] == "virtual" else None
    return {"bound": y.bound, "bound_ratio": ratio, "goodput": y.goodput,
            "unapplied": y.unapplied, "communication": y.communication,
            "not_drawn": y.not_drawn}


def worker_totals(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per worker, by number: seconds per kind of interval, idle fraction (over present
    time: not drawn is not), jobs and updates."""
    spans = reads.interval_seconds(db, run_id)
    wide = spans.pivot_table(index="worker", columns="kind", values="seconds",
                             fill_value=0.0).reset_index()
    for kind in (*COUNTED_KINDS, "hidden exchange"):
        if kind not in wide:
            wide[kind] = 0.0
    counts = reads.updates_per_worker(db, run_id)
    sent = reads.bytes_up_per_worker(db, run_id)
    counts = counts.merge(sent, on="worker", how="outer")
    prof = reads.worker_profiles(db, run_id)
    out = prof.merge(wide, on="worker", how="left").merge(counts, on="worker", how="left")
    out = out.fillna({**{k: 0.0 for k in (*COUNTED_KINDS, "hidden exchange")},
                      "updates": 0, "bytes_up": 0})
    # the hidden exchange overlaps compute, offline time is no one's work, and a worker
    # not drawn in a sampled round took no part in it
    out["accounted"] = out[list(PRESENT_KINDS)].sum(axis=1)
    out["idle_fraction"] = (out["idle"] / out["accounted"].where(out["accounted"] > 0)
                            ).fillna(0.0)
    out["updates"] = out["updates"].astype(int)
    return out.sort_values("worker", ignore_index=True)


def recent_intervals(db: str | Path, run_id: int, window: float,
                     limit: int = 5000) -> pd.DataFrame:
    """Intervals ending in the last ``window`` virtual seconds (at most ``limit``);
    spans of lost jobs have the kind ``lost job``."""
    end = reads.latest_time(db, run_id)
    return reads.intervals_ending_after(db, run_id, end - window, limit)


def in_flight(db: str | Path, run_id: int) -> pd.DataFrame:
    """Jobs dispatched and not finished, drawn from dispatch to the latest known time."""
    now = reads.latest_time(db, run_id)
    frame = reads.running_jobs(db, run_id)
    frame["t_end"] = now
    return frame[frame["t_end"] > frame["t_start"]]


def shards(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per data shard: jobs and inner steps trained on it (done jobs), by how many
    workers, and how far its schedule got (empty for runs recorded before shards)."""
    return reads.shard_totals(db, run_id)


def metrics(db: str | Path, run_ids: list[int]) -> pd.DataFrame:
    if not run_ids:
        return pd.DataFrame()
    return reads.metrics(db, run_ids)


def staleness(db: str | Path, run_id: int) -> pd.DataFrame:
    return reads.staleness_counts(db, run_id)


FAILURE_COLUMNS = ["faults injected", "lost: error", "lost: rejected", "lost: deadline",
                   "lost: departed", "retired", "late or duplicate replies", "offline periods"]


def failures(db: str | Path, run_id: int) -> pd.DataFrame:
    """Per worker: injected faults by kind, lost jobs by reason, ignored replies,
    offline periods (empty when the run had none of these)."""
    injected = reads.faults_injected(db, run_id)
    lost = reads.lost_jobs(db, run_id)
    other = reads.ignored_and_offline(db, run_id)
    if injected.empty and lost.empty and other.empty:
        return pd.DataFrame()
    workers = sorted(set(injected["worker"]) | set(lost["worker"]) | set(other["worker"]))
    rows = []
    for w in workers:
        inj = injected[injected["worker"] == w]
        ls = dict(zip(*lost[lost["worker"] == w][["reason", "n"]].values.T)) \
            if (lost["worker"] == w).any() else {}
        ot = dict(zip(*other[other["worker"] == w][["kind", "n"]].values.T)) \
            if (other["worker"] == w).any() else {}
        rows.append({"worker": int(w),
                     "faults injected": ", ".join(f"{d} x{n}" for d, n in
                                                  zip(inj["detail"], inj["n"])) or "-",
                     "lost: error": int(ls.get("error", 0)),
                     "lost: rejected": int(ls.get("rejected", 0)),
                     "lost: deadline": int(ls.get("deadline", 0)),
                     # its worker went away mid-job (a fleet that changes over time)
                     "lost: departed": int(ls.get("departed", 0)),
                     "retired": "yes" if ls.get("retired") else "",
                     "late or duplicate replies": int(ot.get("late_reply", 0)
                                                      + ot.get("duplicate_reply", 0)),
                     "offline periods": int(ot.get("worker_offline", 0))})
    return pd.DataFrame(rows, columns=["worker", *FAILURE_COLUMNS])


def events(db: str | Path, run_id: int, limit: int = 200) -> pd.DataFrame:
    return reads.recent_events(db, run_id, limit)


def regions(db: str | Path, run_id: int) -> dict[str, pd.DataFrame] | None:
    """A two-level (halos) run by region, or None for other runs:

    ``table``     per region: workers, updates, idle %, mean staleness of its workers'
                  updates (region versions), pushes and their mean staleness (global
                  versions), bytes it sent to and got from the global server
    ``versions``  each region server's version and the global version over virtual time
    ``traffic``   bytes between the region servers and the global server, per kind,
                  in bins of virtual time (by when a transfer left)"""
    moved = reads.transfers(db, run_id)
    if moved.empty or not (moved["kind"] == "model").any():  # no model came back down:
        return None  # not two levels (a pipelined server's pushes are its workers' updates)
    prof = reads.worker_profiles(db, run_id).sort_values("worker")
    names = list(dict.fromkeys(prof["region"]))  # regions in order of their first worker
    region_of = dict(zip(prof["worker"], prof["region"]))
    ups = reads.update_arrivals(db, run_id)
    ups["region"] = ups["worker"].map(region_of)
    moved["region"] = moved["region"].map(lambda r: names[r])
    wt = worker_totals(db, run_id)
    wt["region"] = wt["worker"].map(region_of)
    # each region's traffic with the global server, as `fedlm show` gives it
    traffic_of = {r["region"]: r for r in region_transfers(db, run_id)}
    rows = []
    for name in names:
        mine = wt[wt["region"] == name]
        sent = traffic_of.get(name, {"pushes": 0, "push_staleness": float("nan"),
                                     "bytes_up": 0, "bytes_down": 0})
        rows.append({"region": name, "workers": len(mine),
                     "updates": int((ups["region"] == name).sum()),
                     "idle %": 100 * mine["idle"].sum() / max(mine["accounted"].sum(), 1e-9),
                     "update staleness": ups.loc[ups["region"] == name, "staleness"].mean(),
                     "pushes": sent["pushes"], "push staleness": sent["push_staleness"],
                     "bytes up": int(sent["bytes_up"]), "bytes down": int(sent["bytes_down"])})
    table = pd.DataFrame(rows)
    ups["version"] = ups.groupby("region").cumcount() + 1
    versions = pd.concat([ups[["t_done", "region", "version"]].rename(columns={"t_done": "t"}),
                          moved[moved["kind"] == "push"].assign(
                              region="global", version=lambda f: range(1, len(f) + 1))[
                              ["t_arrived", "region", "version"]].rename(
                              columns={"t_arrived": "t"})], ignore_index=True)
    span = max(float(moved["t_arrived"].max()), 1e-9)
    width = span / 40
    traffic = (moved.assign(t=(moved["t_sent"] // width) * width)
               .groupby(["t", "kind"], as_index=False)["bytes"].sum())
    return {"table": table, "versions": versions, "traffic": traffic}


def rounds(db: str | Path, run_id: int) -> pd.DataFrame | None:
    """A sampled run's rounds (``fedlm.store.rounds``), or None for a run that drew none."""
    rs = read_rounds(db, run_id)
    if not rs:
        return None
    return pd.DataFrame([{"round": k, "version": r.version, "available": r.available,
                          "drawn": r.drawn, "kept": r.kept, "dropped": r.dropped,
                          "cut by deadline": r.deadline, "lost": r.lost, "wasted": r.wasted}
                         for k, r in enumerate(rs)])

