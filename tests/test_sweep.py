"""Sweeps: the paper sweep's --quick mode end to end on the tiny model (in-process
backend), and sweeps over seeds: their runs, names, checks and report."""

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fedlm import store
from fedlm.store import RunWriter
from fedlm.sweep.run import Failure, run_sweep
from fedlm.sweep.spec import cells_of, load_spec, overrides, run_name
from fedlm.sweep.report import report, write_report
from tests._cli import assert_refused, no_work_fixture, run_cli  # noqa: F401 (a fixture)
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parent.parent


def test_quick_paper_sweep_writes_tables_and_plots(tmp_path):
    out = tmp_path / "results" / "paper_quick.md"
    proc = subprocess.run(
        [sys.executable, "-m", "fedlm", "sweep", str(ROOT / "experiments/archive/configs/paper.toml"),
         "--quick", "--backend", "inprocess", "--jobs", "2", "--db", str(tmp_path / "q.db"),
         "--out", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = out.read_text()
    assert "| arm | very | moderate | paper: very / moderate |" in text
    for arm in ("DiLoCo (sync)", "DN + DyLU, lr 0.7", "Async DiLoCo (naive), lr 0.35",
                "none: DiLoCo (sync)", "none: DN + DyLU, lr 0.175"):
        assert f"| {arm} |" in text
    assert "41.35 / 41.35" in text  # the paper's numbers beside ours
    # an ablation arm runs only where it says, and is compared with its own reference
    gaps = text.split("### Per-update gap")[1].split("###")[0]
    assert "| none: DiLoCo (sync) | +0.0% | – |" in gaps
    assert "| DiLoCo (sync) | +0.0% | +0.0% |" in gaps
    assert "as a fraction of the reference's own time" in text
    for png in ("paper_quick_ppl_vs_time.png", "paper_quick_ppl_vs_updates.png"):
        assert (out.parent / png).stat().st_size > 10_000
    # (a run trained beside others, --jobs 2, ends as the same run trained alone:
    # tests/test_store_concurrency.py, on concurrent `fedlm run` processes as here)
    # a second invocation reuses the finished runs instead of training again
    again = subprocess.run(
        [sys.executable, "-m", "fedlm", "sweep", str(ROOT / "experiments/archive/configs/paper.toml"),
         "--quick", "--backend", "inprocess", "--db", str(tmp_path / "q.db"), "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("reusing run") == 8


# ---------------------------------------------------------------------------
# seeds: every cell once per seed, named so that finished runs are reused
# ---------------------------------------------------------------------------

def _spec(**top) -> dict:
    return {"db": "s.db", "out": "s.md", "profiles": ["very", "moderate"],
            "arm": [{"label": "ref", "reference": True, "set": ["strategy=diloco", "seed=7"]},
                    {"label": "dn", "set": ["strategy=delayed-nesterov"]}], **top}


def test_without_seeds_a_cell_is_one_run_under_the_name_it_always_had():
    spec = _spec(base=["seed=3"])
    cells = cells_of(spec)
    assert [c.name for c in cells] == ["ref @ very", "dn @ very", "ref @ moderate",
                                       "dn @ moderate"]
    assert {c.seed for c in cells} == {None}
    assert overrides(spec, cells[0]) == ["seed=3", "profile=very", "strategy=diloco", "seed=7"]


def test_seeds_run_every_cell_per_seed_and_the_seed_is_set_last():
    spec = _spec(seeds=[0, 5])
    spec["arm"][1]["seeds"] = [5, 9]  # an arm's own seeds replace the spec's
    cells = cells_of(spec)
    assert [c.name for c in cells] == [
        "ref @ very seed 0", "ref @ moderate seed 0",  # seed by seed
        "ref @ very seed 5", "dn @ very seed 5", "ref @ moderate seed 5", "dn @ moderate seed 5",
        "dn @ very seed 9", "dn @ moderate seed 9"]
    ref = cells[0]
    assert overrides(spec, ref)[-2:] == ["seed=7", "seed=0"]  # after the arm's: it wins


def _write_spec(folder, spec) -> Path:
    import tomli_w

    path = folder / "s.toml"
    path.write_text(tomli_w.dumps(spec))
    return path


def test_seeds_flag_replaces_the_spec_and_every_arms_seeds(tmp_path):
    spec = _spec(seeds=[4], base=["model=tiny"])
    spec["arm"][1]["seeds"] = [8]
    loaded = load_spec(_write_spec(tmp_path, spec), quick=False, seeds=3)
    assert loaded["seeds"] == [0, 1, 2] and "seeds" not in loaded["arm"][1]
    assert {c.seed for c in cells_of(loaded)} == {0, 1, 2}
    assert load_spec(_write_spec(tmp_path, spec), quick=False)["arm"][1]["seeds"] == [8]


@pytest.mark.parametrize("where, seeds, fragment", [
    ("top", [], "seeds: must be a non-empty list of integers, got []"),
    ("top", 3, "seeds: must be a non-empty list of integers, got 3"),
    ("top", [0, 0], "seeds: seeds must be distinct, got [0, 0]"),
    ("top", [0, "1"], "seeds: must be a list of integers, got [0, '1']"),
    ("top", [True], "seeds: must be a list of integers, got [True]"),
    ("top", [1.5], "seeds: must be a list of integers"),
    ("top", [-1], "seeds: each seed must be in [0, 2**63), got [-1]"),
    ("arm", [2, 2], "arm[1].seeds: seeds must be distinct, got [2, 2]"),
    ("arm only", [2], "arm[1].seeds: needs the spec's own seeds too"),
])
def test_bad_seeds_are_refused_in_one_line(no_work, where, seeds, fragment):
    spec = _spec(base=["model=tiny"])
    if where == "top":
        spec["seeds"] = seeds
    else:
        spec["arm"][1]["seeds"] = seeds
        if where == "arm":
            spec["seeds"] = [0]
    _write_spec(no_work, spec)
    assert_refused(*run_cli(["sweep", "s.toml"]), f"sweep spec s.toml: {fragment}")


@pytest.mark.parametrize("n", ["0", "-2", "two"])
def test_a_seeds_count_below_one_is_refused(no_work, n):
    _write_spec(no_work, _spec(base=["model=tiny"]))
    assert_refused(*run_cli(["sweep", "s.toml", "--seeds", n]), "argument --seeds")
    assert run_cli(["sweep", "s.toml", "--seeds", "2"])[0] == "started"


# -- the report over seeds, on runs with known numbers (no training) -----------

def _stored_run(db, name, seed, curve, virtual_time, start="s0", spans=()):
    """A finished run whose evaluations are ``curve``: (virtual time, perplexity), from
    the weights ``start`` (their hash); its worker's ``spans``: (kind, start, end)."""
    w = RunWriter(db, name=name, strategy="diloco", local_steps="fixed", profile="very",
                  model="tiny", workers=1, seed=seed or 0, clock="virtual",
                  config_json=tiny_config().to_json())
    w.set_model_info(1, "seeded", start)
    w.add_workers([{"worker": 0, "node_id": None, "step_time": 1.0, "jitter": 0.0,
                    "region": "local", "latency": 0.0, "down_bw": 1e9, "up_bw": 1e9,
                    "shard_sequences": 10}])
    w.add_intervals([(0, kind, a, b, 0, 1) for kind, a, b in spans])
    for k, (vt, ppl) in enumerate(curve):
        w.add_metric(version=k, virtual_time=vt, wall_time=0.0, tokens=k, jobs=k, loss=1.0,
                     perplexity=ppl, bits_per_byte=1.0)
    w.finish(status="finished", virtual_time=virtual_time, updates=len(curve) - 1,
             final_hash="x")
    w.close()


REF_CURVE = [(0, 100.0), (25, 40.0), (50, 20.0), (75, 15.0), (100, 10.0)]
FAST = {0: (50, 11.0), 1: (40, 12.0), 2: (60, 13.0)}  # seed: (virtual time, final perplexity)


def _report_spec(tmp_path, seeds) -> dict:
    return {"db": str(tmp_path / "r.db"), "out": str(tmp_path / "r.md"), "profiles": ["very"],
            **({"seeds": seeds} if seeds else {}),
            "arm": [{"label": "ref", "reference": True, "set": []},
                    {"label": "fast", "set": []}, {"label": "slow", "set": []}],
            "paper": {"ref": [41.35]}}


def _store_runs(spec, seeds) -> None:
    for seed in seeds:
        _stored_run(spec["db"], run_name("ref", "very", seed), seed, REF_CURVE, 100)
        vt, final = FAST[seed or 0]
        _stored_run(spec["db"], run_name("fast", "very", seed), seed,
                    [(0, 100.0), (vt / 2, 30.0), (vt, final)], vt,
                    spans=[("download", 0, 10), ("compute", 10, 30), ("idle", 30, 40)])
        _stored_run(spec["db"], run_name("slow", "very", seed), seed,
                    [(0, 100.0), (80, 9.0 if seed in (0, None) else 12.0)], 80)


def _section(text: str, title: str) -> str:
    return text.split(f"### {title}")[1].split("###")[0]


def test_the_report_gives_means_intervals_and_paired_differences_over_seeds(tmp_path):
    spec = _report_spec(tmp_path, [0, 1, 2])
    _store_runs(spec, [0, 1, 2])
    result = run_sweep(spec, backend="inprocess", log=lambda _: None)  # all reused
    assert len(result.cells) == 9 and not result.failures
    assert {(c.arm, c.seed) for c in result.cells} >= {("fast", 0), ("fast", 2)}
    text, written = write_report(spec, result)
    # final perplexity 11, 12, 13: mean 12, sd 1, ± t(0.975, 2) · 1 / √3; the paper beside
    assert "| fast | 12.000 ± 2.484 (sd 1.000, n=3) | – |" in text
    assert "| ref | 10.000 ± 0.000 (sd 0.000, n=3) | 41.35 |" in text
    # paired by seed against ref's 10: +10, +20, +30%
    assert "| fast | +20.0 ± 24.8% |" in _section(text, "Per-update gap")
    assert "| ref | +0.0 ± 0.0% |" in _section(text, "Per-update gap")
    assert "| fast | 50 ± 25 |" in _section(text, "Virtual time the run needed")
    # its worker's 40 s: 10 downloading, 20 computing a job never applied, 10 idle
    spent = _section(text, "Where present worker time went")
    assert "| fast | 0 / 50 / 25 / 25 |" in spent and "| ref | - |" in spent
    assert "| fast | 0.50 ± 0.25x |" in _section(text, "... as a ratio to ref's")
    # equal time: the sooner end of each pair (fast's 50, 40, 60 s); ref there 20, 40, 20;
    # fast's final against those: -45, -70, -35%
    assert "| fast | 12.000 vs 26.667 (-50.0 ± 44.8%; at 50 s) |" in _section(
        text, "At equal virtual time")
    # equal work: the fewer tokens of the two (fast's 2); ref there 20: -45, -40, -35%
    assert "| fast | 12.000 vs 20.000 (-40.0 ± 12.4%; at 2 tokens) |" in _section(
        text, "At equal work")
    assert "≠start" not in text and "different weights" not in text
    reach = _section(text, "Virtual time to reach")
    assert "| fast | never within its run (equal work) |" in reach
    assert "| slow | 80 (grid 80) (1 of 3 reached) |" in reach  # its previous evaluation: 0 s
    assert "| ref | 100 ± 0 (grid 25) |" in reach
    assert "| slow | 0.80 (grid 0.80) (1 of 3 reached) |" in _section(text, "... as a fraction")
    assert "Student t" in text and "paired" in text
    assert "band from the lowest to the highest seed" in text
    for png in written[1:]:
        assert png.stat().st_size > 10_000
    assert not [p for p in written if "frontier" in p.name]  # these runs have no fleet bound
    # a seed whose run failed: the paired difference over the seeds left, n said
    cells = [c for c in result.cells if not (c.arm == "fast" and c.seed == 2)]
    text = report(spec, cells, [Failure("fast", "very", "boom", 2)])
    assert "| fast | +15.0 ± 63.5% (n=2) |" in _section(text, "Per-update gap")
    assert "- **fast @ very seed 2**: boom" in text
    cells = [c for c in cells if not (c.arm == "fast" and c.seed == 1)]
    assert "| fast | +10.0% (n=1: no interval) |" in report(spec, cells)


def test_a_report_without_seeds_looks_as_it_always_did(tmp_path):
    spec = _report_spec(tmp_path, None)
    _store_runs(spec, [None])
    result = run_sweep(spec, backend="inprocess", log=lambda _: None)
    assert [c.seed for c in result.cells] == [None] * 3
    text = report(spec, result.cells)
    assert "±" not in text and "One run per cell (one seed): no intervals" in text
    assert "| fast | 11.000 | – |" in text
    assert "| fast | +10.0% |" in _section(text, "Per-update gap")
    assert "| fast | 0.50x |" in _section(text, "... as a ratio")
    assert "| slow | 80 (grid 80) |" in _section(text, "Virtual time to reach")
    assert "| fast | #2 (x), " in _section(text, "Run id and real time")  # its hash, short


def test_report_only_runs_nothing_and_says_what_is_missing(tmp_path):
    spec = _report_spec(tmp_path, [0, 1, 2])
    for seed in (0, 1):  # seed 2 never ran; slow never ran at all
        _stored_run(spec["db"], run_name("ref", "very", seed), seed, REF_CURVE, 100)
        vt, final = FAST[seed]
        _stored_run(spec["db"], run_name("fast", "very", seed), seed, [(0, 100.0), (vt, final)],
                    vt)
    result = run_sweep(spec, backend="inprocess", report_only=True, log=lambda _: None)
    assert len(result.cells) == 4 and not result.failures
    assert result.not_run == ["slow @ very seed 0", "slow @ very seed 1", "ref @ very seed 2",
                              "fast @ very seed 2", "slow @ very seed 2"]  # in the sweep's order
    assert len(store.list_runs(spec["db"])) == 4  # none started
    text = report(spec, result.cells, result.failures, result.not_run)
    assert "**5 of 9 planned runs were not run**" in text
    assert "| fast | 11.500 ± 6.353 (sd 0.707, n=2) | – |" in text
    assert "| slow | not run | – |" in text
    assert "- slow @ very seed 2" in _section(text, "Not run")
    # the command: exit 0, one line on what is missing; --rerun with it is refused
    path = _write_spec(tmp_path, spec)
    cmd = [sys.executable, "-m", "fedlm", "sweep", str(path), "--backend", "inprocess",
           "--report-only"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fedlm: report of 4 of 9 cells; 5 not run (--report-only)" in proc.stderr
    assert "| slow | not run | – |" in (tmp_path / "r.md").read_text()
    proc = subprocess.run([*cmd, "--rerun"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--report-only runs nothing" in proc.stderr
    assert "Traceback" not in proc.stderr



def test_arms_runs_a_part_of_a_spec_with_its_references_and_says_so(tmp_path):
    """``--arms``: the arms whose label contains the text, each still compared with the
    arm the whole spec compares it with (the spec's reference, or a group's own), under
    the run names the whole spec reuses; a text no label contains: one line."""
    from fedlm.errors import ConfigError
    from fedlm.sweep.spec import only_arms, reference_of

    spec = {"profiles": ["very"], "arm": [
        {"label": "ref", "reference": True}, {"label": "b: sync", "set": []},
        {"label": "b: fast", "against": "b: sync"}, {"label": "d: fast", "set": []}]}
    part = only_arms(spec, ["B: FAST"])
    assert [a["label"] for a in part["arm"]] == ["ref", "b: sync", "b: fast"]
    assert [reference_of(part, a) for a in part["arm"]] == ["ref", "b: sync", "b: sync"]
    assert [a["label"] for a in only_arms(spec, ["d:", "nothing"])["arm"]] == ["ref", "d: fast"]
    alone = only_arms(spec, ["b: sync"])  # a group's reference kept without its group
    assert [reference_of(alone, a) for a in alone["arm"]] == ["ref", "b: sync"]
    assert "against" not in part["arm"][1]  # said only where the part would differ
    assert spec["arm"][1] == {"label": "b: sync", "set": []}  # the spec is not changed
    with pytest.raises(ConfigError, match=r"^--arms: no arm's label contains 'x' \(the arms: "
                                          r"ref; b: sync; b: fast; d: fast\)$"):
        only_arms(spec, ["x"])
    with pytest.raises(ConfigError, match=r"^--arms: an empty text names every arm"):
        only_arms(spec, ["b:", " "])
    # the command: the part's cells only, reusing the whole spec's finished runs by name
    spec = _report_spec(tmp_path, [0])
    _store_runs(spec, [0])
    path = _write_spec(tmp_path, spec)
    cmd = [sys.executable, "-m", "fedlm", "sweep", str(path), "--backend", "inprocess",
           "--report-only", "--arms", "slow"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (tmp_path / "r.md").read_text()
    assert "Arms limited to those whose label contains 'slow' (`--arms`)" in text
    assert "fedlm: --arms: 2 of 3 arms (with the arms they are compared with): ref; slow" \
        in proc.stderr  # said before anything runs: a text that names more than meant shows
    assert "| slow | 9.000 (n=1: no interval) | – |" in text and "| fast |" not in text
    proc = subprocess.run([*cmd[:-1], "nope"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--arms: no arm's label contains 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- end to end: a tiny sweep over seeds ---------------------------------------

TINY = ["model=tiny", "workers=2", "updates=100", "local_step_budget=16", "inner.steps=4",
        "inner.batch_size=2", "eval.every=2", "eval.batches=1", "eval.batch_size=4",
        "data.seq_len=64"]


def test_a_sweep_over_seeds_runs_each_seed_and_reuses_them_by_name(tmp_path):
    spec = {"db": str(tmp_path / "s.db"), "out": str(tmp_path / "s.md"), "base": TINY,
            "profiles": ["very"], "seeds": [0, 1],
            "arm": [{"label": "sync", "reference": True, "set": ["strategy=diloco"]},
                    {"label": "async", "seeds": [1], "set": ["strategy=async-sgd", "seed=7"]}]}
    path = _write_spec(tmp_path, spec)
    cmd = [sys.executable, "-m", "fedlm", "sweep", str(path), "--backend", "inprocess",
           "--jobs", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with sqlite3.connect(tmp_path / "s.db") as conn:
        runs = sorted(conn.execute("SELECT name, seed, status FROM runs").fetchall())
    assert runs == [("async @ very seed 1", 1, "finished"),  # the arm's seed=7 lost
                    ("sync @ very seed 0", 0, "finished"), ("sync @ very seed 1", 1, "finished")]
    text = (tmp_path / "s.md").read_text()
    assert " ± " in text and "(sd " in text
    assert "| async | " in _section(text, "Per-update gap")  # paired with sync's seed 1
    assert "(n=1: no interval)" in _section(text, "Per-update gap")
    assert (tmp_path / "s_ppl_vs_time.png").stat().st_size > 10_000
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("reusing run") == 3, again.stderr


def test_arms_of_one_seed_from_different_starts_are_named_and_their_comparisons_marked(tmp_path):
    """A fair comparison starts both arms from the same weights: where fast's seed 1
    started elsewhere (its own pretraining, say), the report says so at the top and
    marks each comparison that rests on that pair; the other seeds' pairs are clean."""
    spec = _report_spec(tmp_path, [0, 1, 2])
    for seed in (0, 1, 2):
        _stored_run(spec["db"], run_name("ref", "very", seed), seed, REF_CURVE, 100)
        vt, final = FAST[seed]
        _stored_run(spec["db"], run_name("fast", "very", seed), seed,
                    [(0, 100.0), (vt, final)], vt, start="other" if seed == 1 else "s0")
        _stored_run(spec["db"], run_name("slow", "very", seed), seed, [(0, 100.0), (80, 9.0)], 80)
    text = report(spec, run_sweep(spec, backend="inprocess", log=lambda _: None).cells)
    assert "**Arms of one seed started from different weights**" in text
    assert "- very, seed 1: `s0`: ref, slow; `other`: fast" in text
    for title in ("Per-update gap", "... as a ratio", "At equal work", "At equal virtual time",
                  "Virtual time to reach"):
        rows = _section(text, title)
        assert "| fast |" in rows and "≠start (1 of 3) |" in rows.split("| fast |")[1].split("\n")[0]
        assert "≠start" not in rows.split("| slow |")[1].split("\n")[0]
