"""The dashboard against real run databases written by fedlm's own store (AppTest)."""

import json
import sqlite3
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from fedlm.store import IntervalKind, RunWriter, connect
from tests.conftest import tiny_config
from tests.support import run_engine

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")


def app(monkeypatch, db) -> AppTest:
    monkeypatch.setenv("FEDLM_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    return at


def metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


def test_missing_and_empty_databases_say_so(monkeypatch, tmp_path):
    at = app(monkeypatch, tmp_path / "nothing.db")
    assert "No run database" in at.info[0].value
    connect(tmp_path / "empty.db").close()
    at = app(monkeypatch, tmp_path / "empty.db")
    assert "holds no runs yet" in at.info[0].value


def test_finished_runs_show_numbers_charts_and_comparison(monkeypatch, tmp_path):
    db = tmp_path / "r.db"
    run_engine(tiny_config("strategy=diloco", "fleet.step_times=[1.0, 2.0, 4.0]",
                           "name=sync"), db)
    run_engine(tiny_config("strategy=delayed-nesterov", "fleet.step_times=[1.0, 2.0, 4.0]",
                           "updates=12", "eval.every=4", "name=async"), db)
    at = app(monkeypatch, db)
    assert "#2 async" in at.subheader[0].value
    assert metric(at, "updates applied") == "12"
    assert metric(at, "idle fraction") == "0.0%"  # async: nobody waits
    from fedlm.store.yardstick import yardstick

    y = yardstick(db, 2)  # against its fleet's least time: the same numbers as fedlm show
    assert metric(at, "time over the fleet's bound") == f"{y.ratio:.2f}x" and y.ratio >= 1
    assert metric(at, "goodput") == f"{100 * y.goodput:.1f}%"
    assert metric(at, "compute never applied") == f"{100 * y.unapplied:.1f}%"
    assert metric(at, "communication") == f"{100 * y.communication:.1f}%"
    charts = at.get("vega_lite_chart")
    assert len(charts) >= 6  # 3 perplexity tabs, timeline, 3 worker charts, staleness
    assert set(at.multiselect[0].value) == {1, 2}  # both runs on the perplexity charts
    at.selectbox[0].set_value(1).run()
    assert metric(at, "idle fraction") != "0.0%"  # sync: fast workers wait at the barrier
    assert "all 12 updates were fresh" in " ".join(c.value for c in at.caption)


def test_a_growing_run_updates_between_reruns(monkeypatch, tmp_path):
    db = tmp_path / "live.db"
    cfg = tiny_config()
    w = RunWriter(db, name="live", strategy="diloco", local_steps="fixed", profile="moderate",
                  model="tiny", workers=2, seed=0, clock="virtual", config_json=cfg.to_json())
    w.add_workers({"worker": k, "node_id": None, "step_time": 1.0 + k, "jitter": 0.0,
                   "region": "local", "latency": 0.0, "down_bw": 1e9, "up_bw": 1e9,
                   "shard_sequences": 10} for k in range(2))
    w.add_metric(version=0, virtual_time=0.0, wall_time=0.0, tokens=0, jobs=0, loss=5.0,
                 perplexity=148.4, bits_per_byte=7.2)
    w.add_intervals([(0, IntervalKind.COMPUTE, 0.0, 3.0, 0, 0),
                     (1, IntervalKind.COMPUTE, 0.0, 6.0, 0, 1),
                     (0, IntervalKind.IDLE, 3.0, 6.0, 0, None)])
    w.commit()
    at = app(monkeypatch, db)
    assert metric(at, "latest perplexity") == "148.40"
    assert "running" in at.caption[0].value
    assert metric(at, "idle fraction") == "25.0%"  # 3 of 12 worker-seconds

    w.add_metric(version=1, virtual_time=6.0, wall_time=1.0, tokens=100, jobs=2, loss=3.0,
                 perplexity=20.09, bits_per_byte=4.3)
    w.add_intervals([(0, IntervalKind.COMPUTE, 6.0, 9.0, 1, 2),
                     (1, IntervalKind.COMPUTE, 6.0, 12.0, 1, 3),
                     (0, IntervalKind.IDLE, 9.0, 12.0, 1, None)])
    w.commit()  # the writer keeps its connection open, as during a real run
    at.run()  # what run_every does in a browser
    assert metric(at, "latest perplexity") == "20.09"
    assert metric(at, "best perplexity") == "20.09"
    assert metric(at, "virtual time") == "12 s"
    w.finish(status="finished", virtual_time=12.0, updates=1, final_hash="x")
    w.close()
    at.run()
    assert "finished" in at.caption[0].value


@pytest.mark.parametrize("n", [100_000])
def test_a_big_run_renders_with_a_bounded_timeline(monkeypatch, tmp_path, n):
    db = tmp_path / "big.db"
    cfg = tiny_config()
    w = RunWriter(db, name="big", strategy="async-sgd", local_steps="fixed", profile="very",
                  model="tiny", workers=16, seed=0, clock="virtual", config_json=cfg.to_json())
    w.add_workers({"worker": k, "node_id": None, "step_time": 1.0, "jitter": 0.0,
                   "region": "local", "latency": 0.0, "down_bw": 1e9, "up_bw": 1e9,
                   "shard_sequences": 10} for k in range(16))
    kinds = [IntervalKind.DOWNLOAD, IntervalKind.COMPUTE, IntervalKind.UPLOAD, IntervalKind.IDLE]
    w.add_intervals((i % 16, kinds[i % 4], float(i), i + 0.9, i // 64, i) for i in range(n))
    for v in range(0, 500, 10):
        w.add_metric(version=v, virtual_time=float(v), wall_time=0.0, tokens=v, jobs=v,
                     loss=5.0 / (1 + v / 100), perplexity=2.0 ** (5.0 / (1 + v / 100)),
                     bits_per_byte=1.0)
    w.finish(status="finished", virtual_time=float(n), updates=500, final_hash="x")
    w.close()
    t0 = time.perf_counter()
    at = app(monkeypatch, db)
    print(f"\n{n:,} intervals: first render {time.perf_counter() - t0:.2f} s")
    caption = " ".join(c.value for c in at.caption)
    assert "5,000 intervals drawn" in caption


def test_injected_faults_show_in_the_failures_table_and_timeline(monkeypatch, tmp_path):
    db = tmp_path / "faults.db"
    run_engine(tiny_config("strategy=async-sgd", "updates=10", "faults.crash=0.15",
                           "faults.hang=0.1", "faults.nan=0.1", "faults.bad_shape=0.1",
                           "faults.duplicate=0.1", "faults.offline=0.2",
                           "faults.offline_seconds=15"), db)
    at = app(monkeypatch, db)
    shown = " ".join(str(v) for t in at.table for v in t.value.to_numpy().ravel())
    with sqlite3.connect(db) as conn:
        kinds = {d for (d,) in conn.execute("SELECT detail FROM events"
                                            " WHERE kind='fault_injected'")}
    assert len(kinds) >= 3
    for kind in kinds:  # every injected kind is named in the failures table
        assert f"{kind} x" in shown
    from fedlm.dashboard import queries

    iv = queries.recent_intervals(db, 1, window=1e9)
    assert {"offline", "lost job"} <= set(iv["kind"])


def test_geo_run_with_compression_shows_bytes_and_link_waits(monkeypatch, tmp_path):
    db = tmp_path / "geo.db"
    common = ["workers=4", "fleet.topology={us = 2, asia = 2}", "strategy=diloco",
              "network.server_up=2e6"]
    run_engine(tiny_config(*common, "name=fp32"), db)
    run_engine(tiny_config(*common, "network.compression=int4", "name=int4"), db)
    at = app(monkeypatch, db)  # the newest run (int4) in focus
    int4_up = metric(at, "sent up")
    assert metric(at, "waiting for the link") != "0.0 s"
    at.selectbox[0].set_value(1).run()
    fp32_up = metric(at, "sent up")
    size = {"kB": 1e3, "MB": 1e6, "GB": 1e9}
    as_bytes = [float(v.split()[0].replace(",", "")) * size[v.split()[1]]
                for v in (int4_up, fp32_up)]
    assert as_bytes[0] < as_bytes[1] / 5  # 4-bit updates: about an eighth of fp32
    assert "link wait" in " ".join(str(c) for t in at.table for c in t.value.columns)


def test_a_streaming_run_shows_its_hidden_and_exposed_communication(monkeypatch, tmp_path):
    """Streaming DiLoCo: the per-worker table splits communication into exposed and
    hidden, and the timeline draws the hidden exchange beside the compute."""
    from fedlm.runner import run_inprocess

    db = tmp_path / "stream.db"
    run_inprocess(tiny_config("workers=2", "updates=2", "inner.steps=4", "fleet.preset=geo",
                              "stream.fragments=2", "stream.overlap=1"), str(db))
    at = app(monkeypatch, db)
    (table,) = [t.value for t in at.table if "hidden comm s" in t.value.columns]
    assert all(float(v) > 0 for v in table["hidden comm s"])
    assert "exposed comm s" in table.columns
    kinds = {k for (k,) in sqlite3.connect(db).execute("SELECT DISTINCT kind FROM intervals")}
    assert {"hidden exchange", "exchange", "compute"} <= kinds


def test_runs_of_two_seeds_compare_as_one_arm_with_a_band(monkeypatch, tmp_path):
    import json

    db = tmp_path / "seeds.db"
    for seed in (0, 1):  # as `fedlm sweep --seeds 2` names them
        run_engine(tiny_config("strategy=diloco", f"seed={seed}",
                               f"name=sync @ very seed {seed}"), db)
    run_engine(tiny_config("strategy=fedavg", "name=other"), db)  # another config: no group
    at = app(monkeypatch, db)
    groups = at.multiselect(key="groups")
    assert groups.options == ["sync @ very · seeds 0, 1 (mean of 2, band min–max)"]
    assert groups.value == []  # nothing grouped until asked: the page as before
    assert not any("area" in json.dumps(_spec(c)) for c in at.get("vega_lite_chart"))
    at.multiselect(key="compare").set_value([3])
    groups.set_value([1]).run()
    assert not at.exception, at.exception
    marks = [[_mark(layer) for layer in s.get("layer", [])]
             for s in map(_spec, at.get("vega_lite_chart"))]
    banded = [m for m in marks if "area" in m]
    # vs virtual time, updates, tokens: run 3, the group's band, the group's mean
    assert banded == [["line", "area", "line"]] * 3
    assert "band from the lowest to the highest seed" in " ".join(c.value for c in at.caption)


def _spec(chart) -> dict:
    import json

    return json.loads(chart.proto.spec)


def _mark(layer: dict) -> str:
    return layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]


def test_a_diverged_run_says_so_and_why(monkeypatch, tmp_path):
    db = tmp_path / "d.db"
    cfg = tiny_config()
    w = RunWriter(db, name="hot", strategy="diloco", local_steps="fixed", profile="moderate",
                  model="tiny", workers=2, seed=0, clock="virtual", config_json=cfg.to_json())
    w.add_metric(version=0, virtual_time=0.0, wall_time=0.0, tokens=0, jobs=0, loss=5.0,
                 perplexity=148.4, bits_per_byte=7.2)
    why = "validation loss 17.7 at version 12 is 5.3x its best (3.35 at version 6): ..."
    w.finish(status="diverged", virtual_time=10.0, updates=12, final_hash=None, error=why)
    w.close()
    at = app(monkeypatch, db)
    assert "#1 hot (diverged)" in at.subheader[0].value
    assert [e.value for e in at.error] == [f"Diverged: {why}"]


def test_a_halos_run_shows_both_levels(monkeypatch, tmp_path):
    """strategy = halos: a table per region (idle, staleness at both levels, traffic),
    the region servers' versions beside the global one, and the traffic over time."""
    from fedlm.runner import run_inprocess

    db = tmp_path / "halos.db"
    run_inprocess(tiny_config("strategy=halos", "workers=4", "fleet.topology={us = 2, eu = 2}",
                              "updates=8", "outer.push_every=2"), str(db))
    at = app(monkeypatch, db)
    (table,) = [t.value for t in at.table if "push staleness" in t.value.columns]
    assert list(table.index) == ["us", "eu"]
    assert all(int(n) >= 1 for n in table["pushes"])
    pushes = sqlite3.connect(db).execute("SELECT count(*) FROM transfers WHERE kind='push'"
                                         ).fetchone()[0]
    assert sum(int(n) for n in table["pushes"]) == pushes
    titles = " ".join(json.dumps(_spec(c).get("title", "")) for c in at.get("vega_lite_chart"))
    assert "region servers" in titles and "traffic between regions" in titles


def test_runs_of_two_tokenizers_compare_by_bits_per_byte(monkeypatch, tmp_path):
    """Perplexity is per token: the page shows bits per byte beside it, says when the
    runs compared use different tokenizers, and draws either measure."""
    db = tmp_path / "tok.db"
    for name, spec, (first, last) in (("bytes", "byte", (7.9, 4.7)),
                                      ("bpe", "bpe:512", (4.7, 3.6))):
        cfg = tiny_config(f"data.tokenizer={spec}", f"name={name}")
        w = RunWriter(db, name=name, strategy="diloco", local_steps="fixed",
                      profile="moderate", model="tiny", workers=2, seed=0, clock="virtual",
                      config_json=cfg.to_json())
        for v, bpb in enumerate((first, last)):
            w.add_metric(version=v, virtual_time=float(v), wall_time=0.0, tokens=v, jobs=v,
                         loss=bpb, perplexity=2.0 ** (bpb * 2), bits_per_byte=bpb)
        w.finish(status="finished", virtual_time=1.0, updates=1, final_hash="x")
        w.close()
    at = app(monkeypatch, db)
    assert metric(at, "latest bits per byte") == "3.600"
    assert metric(at, "best bits per byte") == "3.600"
    captions = " ".join(c.value for c in at.caption)
    assert "tokenizer bpe:512" in captions
    assert "different tokenizers (bpe:512, byte)" in captions
    assert "validation perplexity" in _y_titles(at)
    at.radio(key="measure").set_value("bits_per_byte").run()
    assert not at.exception, at.exception
    assert "validation bits per byte" in _y_titles(at)
    assert "validation perplexity" not in _y_titles(at)
    assert "different tokenizers" not in " ".join(c.value for c in at.caption)
    at.selectbox[0].set_value(1).run()
    assert metric(at, "latest bits per byte") == "4.700"
    assert "tokenizer byte" in " ".join(c.value for c in at.caption)


def _y_titles(at) -> set:
    """The y-axis titles of every chart on the page (layered charts: each layer's)."""
    specs = [_spec(c) for c in at.get("vega_lite_chart")]
    layers = [layer for s in specs for layer in (s.get("layer") or [s])]
    return {layer.get("encoding", {}).get("y", {}).get("title") for layer in layers}


def test_a_sampled_run_shows_its_rounds_drawn_kept_and_cut(monkeypatch, tmp_path):
    from fedlm.store.rounds import rounds

    db = tmp_path / "s.db"
    run_engine(tiny_config("strategy=diloco", "workers=10", "outer.fraction=0.3",
                           "outer.overcommit=1.3", "profile=very", "updates=4"), db)
    rs = rounds(db, 1)
    assert len(rs) == 4 and rs[0].available == 10 and rs[0].drawn == 4 and rs[0].kept == 3
    at = app(monkeypatch, db)
    assert any("Sampled rounds" in m.value for m in at.markdown)
    caption = " ".join(c.value for c in at.caption)
    assert f"drawn {sum(r.drawn for r in rs)} of" in caption
    assert f"kept {sum(r.kept for r in rs)}, dropped {sum(r.dropped for r in rs)}" in caption


def test_not_drawn_has_its_own_colour_and_workers_go_by_number(monkeypatch, tmp_path):
    """A sampled run's workers left out of a round are painted apart from idle, on the
    timeline and in the legend, with a column of their own; every chart and table by
    worker orders them by number (worker 2 before worker 10), not as text."""
    db = tmp_path / "nd.db"
    run_engine(tiny_config("strategy=diloco", "workers=3", "profile=very", "updates=2",
                           "name=plain"), db)
    run_engine(tiny_config("strategy=fedavg", "workers=12", "outer.fraction=0.25",
                           "profile=very", "updates=3", "name=sampled"), db)
    at = app(monkeypatch, db)  # the newest run (sampled) in focus
    numeric = [f"worker {w}" for w in range(12)]
    layers = [layer for s in map(_spec, at.get("vega_lite_chart"))
              for layer in (s.get("layer") or [s])]
    by_worker = [layer for layer in layers
                 if layer.get("encoding", {}).get("y", {}).get("field") in ("worker", "label")]
    assert len(by_worker) >= 4  # the timeline and the three charts per worker
    assert all(layer["encoding"]["y"]["sort"] == numeric for layer in by_worker)
    timeline = next(layer for layer in by_worker if layer["encoding"]["y"]["field"] == "worker")
    scale = timeline["encoding"]["color"]["scale"]
    colours = dict(zip(scale["domain"], scale["range"]))
    others = {k: c for k, c in colours.items() if k != "not drawn"}
    assert "not drawn" in colours and colours["not drawn"] not in others.values()
    from fedlm.dashboard import queries

    assert "not drawn" in set(queries.recent_intervals(db, 2, window=1e9)["kind"])
    (table,) = [t.value for t in at.table if "idle %" in t.value.columns]
    assert list(table.index) == numeric
    with sqlite3.connect(db) as conn:
        left_out = dict(conn.execute("SELECT worker, SUM(t_end - t_start) FROM intervals "
                                     "WHERE run_id=2 AND kind='not drawn' GROUP BY worker"))
    assert [float(v.replace(",", "")) for v in table["not drawn s"]] == pytest.approx(
        [round(left_out.get(w, 0.0), 1) for w in range(12)], abs=0.051)
    assert any("not drawn" in c.value for c in at.caption)
    at.selectbox[0].set_value(1).run()  # a run that draws no round: no such column
    (table,) = [t.value for t in at.table if "idle %" in t.value.columns]
    assert "not drawn s" not in table.columns
    assert not any("not drawn" in c.value for c in at.caption)


def test_a_damaged_run_is_listed_as_damaged_and_the_others_shown(monkeypatch, tmp_path):
    """One bad row (a config that is JSON but no object) raised a TypeError that took the
    whole page; a value of the wrong type in a run's tables broke its charts."""
    import sqlite3

    db = tmp_path / "r.db"
    for name in ("a", "b", "c"):
        run_engine(tiny_config("strategy=diloco", f"name={name}"), db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET config_json='[1]' WHERE id=1")
        conn.execute("UPDATE intervals SET t_end='abc' WHERE run_id=3 AND rowid IN "
                     "(SELECT MIN(rowid) FROM intervals WHERE run_id=3)")
    at = app(monkeypatch, db)
    assert [w.value for w in at.warning] == [
        "run 1 is damaged: runs.config_json is JSON but not an object ('[1]')"]
    assert at.error[0].value.startswith("run 3 is damaged: intervals row ")  # in focus
    assert not at.get("vega_lite_chart")
    at.selectbox[0].set_value(2).run()
    assert not at.exception and not at.error and at.get("vega_lite_chart")
