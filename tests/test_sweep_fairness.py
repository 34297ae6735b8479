"""Comparisons that cannot mislead. One tuning budget for every arm
(fedlm.sweep.tuning): grids, the choice rule, the refusals that keep the budget equal, a
sweep that tunes on its tuning seeds and runs the choice alone on the held-out ones, a
real tuned sweep end to end. Composite arms run beside each of their parts. (One start
and both clocks: tests/test_sweep.py's report tests.)"""

import subprocess
import sys

import pytest

from fedlm.errors import ConfigError
from fedlm.sweep import tuning
from fedlm.sweep.run import run_sweep
from fedlm.sweep.spec import cells_of, load_spec, run_name, tuning_cells
from fedlm.sweep.report import report
from tests.test_sweep import _section, _stored_run
from tests.conftest import tiny_config  # noqa: F401 (the configs these runs name)


def test_a_grid_is_every_combination_in_key_order_or_a_fixed_random_budget_of_them():
    arm = {"label": "dn", "tune": {"outer": {"lr": [0.35, 0.7]}, "inner.steps": [5, 10]}}
    assert tuning.grid(arm, 4) == [("inner.steps=5", "outer.lr=0.35"),
                                   ("inner.steps=5", "outer.lr=0.7"),
                                   ("inner.steps=10", "outer.lr=0.35"),
                                   ("inner.steps=10", "outer.lr=0.7")]
    three = tuning.grid(arm, 3)
    assert len(three) == 3 and set(three) < set(tuning.grid(arm, 4))
    assert tuning.grid(arm, 3) == three  # drawn from the label: the same every time
    assert tuning.grid({"label": "x", "tune": {"merge": ["tokens", "uniform"]}}, 2) == [
        ('merge="tokens"',), ('merge="uniform"',)]


def test_the_choice_is_the_lowest_mean_final_and_waits_for_every_run():
    a, b, c = ("lr=1",), ("lr=2",), ("lr=3",)
    got = tuning.choose([a, b, c], {a: [9.0, 7.0], b: [7.5, 7.5], c: [1.0, None]}, 2)
    assert got.config == b and got.score == 7.5  # c failed on a seed: never chosen
    assert got.scores == {a: 8.0, b: 7.5, c: None}
    assert tuning.choose([a, b], {a: [9.0, 7.0], b: [8.0]}, 2) is None  # b not ended
    assert tuning.choose([a, b], {a: [8.0], b: [8.0]}, 1).config == a  # ties: grid order
    assert tuning.choose([a], {a: [None]}, 1) is None


def _spec(tmp_path, **extra) -> dict:
    return {"db": str(tmp_path / "t.db"), "out": str(tmp_path / "t.md"),
            "profiles": ["very"], "seeds": [300, 301],
            "tuning": {"seeds": [200], "budget": 2},
            "arm": [{"label": "ref", "reference": True, "set": ["strategy=diloco"],
                     "tune": {"outer.lr": [0.35, 0.7]}},
                    {"label": "dn", "set": ["strategy=delayed-nesterov"],
                     "tune": {"outer.lr": [0.35, 0.7]}}], **extra}


@pytest.mark.parametrize("change, fragment", [
    ({"tuning": {"seeds": [300], "budget": 2}}, "tuning.seeds: [300] are also held-out seeds"),
    ({"tuning": {"seeds": [200], "budget": 3}}, "2 configurations, fewer than the budget of 3"),
    ({"tuning": {"seeds": [200], "budget": 2, "rule": "best-of-luck"}}, "tuning.rule"),
    ({"tuning": {"seeds": [], "budget": 2}}, "tuning.seeds: must be a non-empty list"),
    ({"tuning": {"seeds": [200], "budget": 0}}, "tuning.budget: must be a whole number"),
    ({"arm": [{"label": "ref", "reference": True, "set": []}]},
     "arm 'ref': tune: every arm of a tuned sweep needs a grid"),
    ({"arm": [{"label": "ref", "reference": True, "set": [], "tune": {"outer.lr": []}}]},
     "tune.outer.lr: must be a non-empty list"),
    ({"tuning": {"seeds": [200], "budget": 1},
      "arm": [{"label": "ref", "reference": True, "set": [], "tune": {"outer.lr": [-1.0]}}]},
     "outer.lr"),  # each configuration is checked as `fedlm run` would load it
])
def test_a_tuning_that_would_be_unequal_or_unsound_is_refused(tmp_path, change, fragment):
    import tomli_w

    spec = _spec(tmp_path, **change)
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(spec))
    with pytest.raises(ConfigError, match=None) as info:
        load_spec(path, quick=False)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_grid_without_a_tuning_table_is_refused(tmp_path):
    import tomli_w

    spec = _spec(tmp_path)
    del spec["tuning"]
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(spec))
    with pytest.raises(ConfigError, match="a grid needs a \\[tuning\\] table"):
        load_spec(path, quick=False)


def test_the_sweep_tunes_on_the_tuning_seed_and_runs_the_choice_on_the_held_out_ones(tmp_path):
    """Stored runs stand in for training: the tuning runs' finals decide (ref: 0.7 wins,
    dn: 0.35), the held-out runs are found under the chosen configuration's name, and
    the report says budget, scores and choice; runs of the other configuration on the
    held-out seeds exist too but are not the choice, so they are not reported."""
    spec = _spec(tmp_path)
    finals = {("ref", "0.35"): 9.0, ("ref", "0.7"): 8.0, ("dn", "0.35"): 7.0, ("dn", "0.7"): 12.0}
    for (arm, lr), final in finals.items():
        _stored_run(spec["db"], run_name(arm, "very", 200, (f"outer.lr={lr}",)), 200,
                    [(0, 100.0), (50, final)], 50)
    for arm, lr in (("ref", "0.7"), ("dn", "0.35"), ("dn", "0.7")):
        for seed in (300, 301):
            _stored_run(spec["db"], run_name(arm, "very", seed, (f"outer.lr={lr}",)), seed,
                        [(0, 100.0), (60, 10.0 if lr == "0.7" and arm == "dn" else 6.0)], 60)
    logs = []
    result = run_sweep(spec, backend="inprocess", log=logs.append)  # everything reused
    assert not any(" ..." in line for line in logs), logs  # nothing trained
    assert {(k, c.config) for k, c in spec["chosen"].items()} == {
        (("ref", "very"), ("outer.lr=0.7",)), (("dn", "very"), ("outer.lr=0.35",))}
    names = {store_name(spec, c) for c in result.cells}
    assert names == {"ref @ very [outer.lr=0.7] seed 300", "ref @ very [outer.lr=0.7] seed 301",
                     "dn @ very [outer.lr=0.35] seed 300", "dn @ very [outer.lr=0.35] seed 301"}
    text = report(spec, result.cells)
    rows = _section(text, "Tuning")
    assert "the same budget: 2 configurations" in rows and "tuning seeds 200" in rows
    assert "| dn | very | [outer.lr=0.35] | 7.000 | [outer.lr=0.35] 7.000; [outer.lr=0.7] " \
           "12.000 |" in rows
    assert "| dn | 6.000 ± 0.000" in text  # the choice's held-out runs, not 0.7's 10.0
    assert len(tuning_cells(spec)) == 4 and len(cells_of(spec)) == 4


def store_name(spec, cell) -> str:
    from fedlm import store

    return store.run_row(spec["db"], cell.run_id)["name"]


def test_a_tuned_sweep_end_to_end_on_the_command_line(tmp_path):
    """Real runs (tiny): 2 arms x 2 configurations on one tuning seed, then the choices on
    one held-out seed; a second invocation reuses all six runs."""
    spec = tmp_path / "s.toml"
    spec.write_text(f'''
db = "{tmp_path / 't.db'}"
out = "{tmp_path / 't.md'}"
profiles = ["very"]
seeds = [300]
base = ["model=tiny", "workers=2", "updates=3", "inner.steps=3", "inner.batch_size=4",
        "eval.every=1", "eval.batches=1", "data.seq_len=64"]
[tuning]
seeds = [200]
budget = 2
[[arm]]
label = "sync"
reference = true
set = ["strategy=diloco"]
tune = {{"outer.lr" = [0.35, 0.7]}}
[[arm]]
label = "dn"
set = ["strategy=delayed-nesterov"]
tune = {{"outer.lr" = [0.35, 0.7]}}
''')
    cmd = [sys.executable, "-m", "fedlm", "sweep", str(spec), "--backend", "inprocess",
           "--jobs", "2"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert first.stdout.count("[tuning ") >= 4 and "tuned dn @ very: [outer.lr=" in first.stdout
    text = (tmp_path / "t.md").read_text()
    assert "### Tuning" in text and "| dn | very | [outer.lr=" in text
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("reusing run") == 6


def test_a_composite_arm_runs_beside_each_of_its_parts(tmp_path):
    import tomli_w

    spec = {"db": str(tmp_path / "c.db"), "out": str(tmp_path / "c.md"), "profiles": ["very"],
            "arm": [{"label": "fill", "reference": True, "set": ["strategy=diloco-fill"]},
                    {"label": "MuLoCo", "set": ["strategy=diloco-fill"],
                     "parts": {"Muon": ["inner.optimizer=adamw"],
                               "2-bit": ["network.compression=int8"]}}]}
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(spec))
    arms = {a["label"]: a["set"] for a in load_spec(path, quick=False)["arm"]}
    assert arms == {
        "fill": ["strategy=diloco-fill"],
        "MuLoCo": ["strategy=diloco-fill", "inner.optimizer=adamw", "network.compression=int8"],
        "MuLoCo: Muon alone": ["strategy=diloco-fill", "inner.optimizer=adamw"],
        "MuLoCo: 2-bit alone": ["strategy=diloco-fill", "network.compression=int8"]}
    spec["arm"][1]["parts"] = {"Muon": ["inner.optimizer=adamw"]}
    path.write_text(tomli_w.dumps(spec))
    with pytest.raises(ConfigError, match="parts: a table of at least two"):
        load_spec(path, quick=False)
