"""Sweep specs as a matrix (``fedlm.sweep.matrix``: fleets once, arms once): each current
spec written so expands to exactly the runs its earlier ``[[arm]]`` text named (kept in
tests/fixtures/sweep_specs/), through the real planner, and a bad matrix is refused in
one line naming the key."""

from functools import lru_cache
from pathlib import Path

import pytest

from fedlm.errors import ConfigError
from fedlm.sweep import matrix, tuning
from fedlm.sweep.spec import cells_of, load_spec, only_arms, overrides, reference_of, tuning_cells

ROOT = Path(__file__).resolve().parent.parent
BEFORE = ROOT / "tests" / "fixtures" / "sweep_specs"
REWRITTEN = ["far_workers", "methods_fair", "fleets_fair"]


@pytest.fixture
def at_root(monkeypatch):
    """The specs' relative paths (traces) read from the checkout, their plug-ins from
    examples/ (the specs say `PYTHONPATH=examples`); installed plug-ins read once."""
    from fedlm.strategies import registry

    monkeypatch.setattr(registry, "plugin_strategies", lru_cache(registry.plugin_strategies))
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))


def _settings(spec: dict) -> dict:
    """The spec less its prose (its description names paths that moved since)."""
    return {k: v for k, v in spec.items() if k not in ("title", "description")}


def _runs(spec: dict) -> list[tuple]:
    """Every run the spec plans, tuning runs first, with all that makes it that run."""
    return [(c.name, c.profile, c.seed, c.config, c.tuning, tuple(overrides(spec, c)),
             reference_of(spec, c.arm)) for c in [*tuning_cells(spec), *cells_of(spec)]]


def _chosen(spec: dict) -> dict:
    """The spec as the report sees it once every arm's tuning chose (its last configuration)."""
    budget = spec["tuning"]["budget"]
    return {**spec, "chosen": {(a["label"], p): tuning.Choice(tuning.grid(a, budget)[-1], 1.0, {})
                               for a in spec["arm"] for p in a["profiles"]}}


@pytest.mark.parametrize("name", REWRITTEN)
def test_a_rewritten_spec_is_half_its_earlier_text_or_less(name):
    lines = {p: len(p.read_text().splitlines()) for p in
             (ROOT / "experiments" / "configs" / f"{name}.toml",
              BEFORE / f"{name}.before_matrix.toml")}
    now, before = lines.values()
    assert now * 2 <= before, lines


@pytest.mark.parametrize("name", REWRITTEN)
@pytest.mark.parametrize("how", [{}, {"quick": True}, {"seeds": 2}])
def test_a_rewritten_spec_plans_the_runs_it_named_before(name, how, at_root):
    now = load_spec(ROOT / "experiments" / "configs" / f"{name}.toml",
                    how.get("quick", False), seeds=how.get("seeds"))
    before = load_spec(BEFORE / f"{name}.before_matrix.toml", how.get("quick", False),
                       seeds=how.get("seeds"))
    # every arm's label, against, profiles, set (in order), tune, tune_set; db, base, seeds...
    assert _settings(now) == _settings(before)
    assert len(_runs(now)) > 2 * len(now["arm"])
    assert _runs(now) == _runs(before)
    assert _runs(_chosen(now)) == _runs(_chosen(before))  # the tuned path
    for arm in now["arm"]:
        assert tuning.grid(arm, now["tuning"]["budget"]) == tuning.grid(
            next(a for a in before["arm"] if a["label"] == arm["label"]),
            before["tuning"]["budget"])


@pytest.mark.parametrize("name,texts", [
    ("far_workers", ["semi-sync"]), ("far_workers", ["d trace churn: far DN", "HALoS"]),
    ("methods_fair", ["MuLoCo"]), ("methods_fair", ["fill's job sizes"]),
    ("fleets_fair", ["c slow-downs"]), ("fleets_fair", ["DN + DyLU"])])
def test_a_part_of_a_rewritten_spec_plans_the_same_runs(name, texts, at_root):
    now = only_arms(load_spec(ROOT / "experiments" / "configs" / f"{name}.toml", False), texts)
    before = only_arms(load_spec(BEFORE / f"{name}.before_matrix.toml", False), texts)
    assert _settings(now) == _settings(before)
    assert _runs(now) == _runs(before) and len(_runs(now)) > 0


# -- the expansion itself ------------------------------------------------------

def _matrix(**extra) -> dict:
    return {"db": "s.db", "out": "s.md",
            "fleet": [{"key": "b", "label": "b net", "profiles": ["halos"],
                       "set": ["workers=8"]},
                      {"key": "d", "label": "d churn", "profiles": ["moderate"],
                       "set": ["workers=4"], "tune_set": ["fleet.jitter=0.1"]}],
            "arm": [{"label": "sync", "reference": True, "set": ["strategy=diloco"],
                     "tune": {"outer.lr": [0.35, 0.7]}},
                    {"label": "DN", "set": ["strategy=delayed-nesterov", "eval.every=8"],
                     "tune": {"outer.lr": [0.35, 0.7]},
                     "per_fleet": {"d": {"set": ["eval.every=4"], "tune": {"outer.lr": [0.1, 0.2]},
                                         "tune_set": ["fleet.jitter=0.2"]}}},
                    {"label": "DN vs DN", "against": "DN", "fleets": ["d"],
                     "set": ["strategy=delayed-nesterov"]}], **extra}


def test_a_matrix_is_each_arm_on_each_of_its_fleets_fleet_by_fleet():
    spec = matrix.expand(_matrix(), "s")
    assert "fleet" not in spec and spec["profiles"] == ["halos", "moderate"]
    assert spec["arm"] == [
        {"label": "b net: sync", "reference": True, "profiles": ["halos"],
         "set": ["workers=8", "strategy=diloco"], "tune": {"outer.lr": [0.35, 0.7]}},
        {"label": "b net: DN", "against": "b net: sync", "profiles": ["halos"],
         "set": ["workers=8", "strategy=delayed-nesterov", "eval.every=8"],
         "tune": {"outer.lr": [0.35, 0.7]}},
        {"label": "d churn: sync", "profiles": ["moderate"],  # its fleet's group reference
         "set": ["workers=4", "strategy=diloco"], "tune": {"outer.lr": [0.35, 0.7]},
         "tune_set": ["fleet.jitter=0.1"]},
        {"label": "d churn: DN", "against": "d churn: sync", "profiles": ["moderate"],
         "set": ["workers=4", "strategy=delayed-nesterov", "eval.every=8", "eval.every=4"],
         "tune": {"outer.lr": [0.1, 0.2]},  # d's grid in place of the arm's
         "tune_set": ["fleet.jitter=0.1", "fleet.jitter=0.2"]},
        {"label": "d churn: DN vs DN", "against": "d churn: DN", "profiles": ["moderate"],
         "set": ["workers=4", "strategy=delayed-nesterov"], "tune_set": ["fleet.jitter=0.1"]}]


def test_a_spec_without_fleets_is_read_as_written():
    raw = {"arm": [{"label": "a", "set": []}]}
    assert matrix.expand(raw, "s") is raw


def test_a_fleet_is_named_by_its_label_without_a_key_and_the_spec_profiles_stay():
    raw = _matrix(profiles=["moderate", "halos"])
    for fleet in raw["fleet"]:
        del fleet["key"]
    raw["arm"][1]["per_fleet"] = {"d churn": raw["arm"][1]["per_fleet"]["d"]}
    raw["arm"][2]["fleets"] = ["d churn"]
    spec = matrix.expand(raw, "s")
    assert spec["profiles"] == ["moderate", "halos"]
    assert [a["label"] for a in spec["arm"]][-1] == "d churn: DN vs DN"
    assert "key" not in raw["fleet"][0]  # what was read is not changed


def test_a_matrix_spec_file_loads_and_plans(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('db = "m.db"\nout = "m.md"\nbase = ["model=tiny"]\n'
                    '[[fleet]]\nkey = "a"\nlabel = "a very"\nprofiles = ["very"]\n'
                    'set = ["workers=2"]\n'
                    '[[arm]]\nlabel = "sync"\nreference = true\nset = ["strategy=diloco"]\n'
                    '[[arm]]\nlabel = "DN"\nset = ["strategy=delayed-nesterov"]\n'
                    'per_fleet.a.set = ["eval.every=8"]\n')
    spec = load_spec(path, quick=False)
    assert [(c.name, overrides(spec, c)) for c in cells_of(spec)] == [
        ("a very: sync @ very", ["model=tiny", "profile=very", "workers=2", "strategy=diloco"]),
        ("a very: DN @ very", ["model=tiny", "profile=very", "workers=2",
                               "strategy=delayed-nesterov", "eval.every=8"])]


def _edit(change) -> dict:
    raw = _matrix()
    change(raw)
    return raw


REFUSED = [
    (lambda r: r["arm"][2].update(fleets=["e"]), "arm 'DN vs DN': fleets: no fleet 'e'"),
    (lambda r: r["arm"][2].update(fleets=["d", "d"]), "arm 'DN vs DN': fleets: 'd' twice"),
    (lambda r: r["fleet"].append(dict(r["fleet"][0], label="b again")),
     "fleet[2].key: 'b' twice"),
    (lambda r: r["fleet"].append(dict(r["fleet"][0], key="e")), "fleet[2].label: 'b net' twice"),
    (lambda r: r["arm"][2].update(per_fleet={"b": {"set": ["eval.every=2"]}}),
     "arm 'DN vs DN': per_fleet.b: the arm does not run on fleet 'b'"),
    (lambda r: r["arm"][1].update(per_fleet={"e": {"set": []}}),
     "arm 'DN': per_fleet.e: no fleet 'e'"),
    (lambda r: r["arm"][1]["per_fleet"]["d"].update(profiles=["very"]),
     "arm 'DN': per_fleet.d.profiles: not a per-fleet difference"),
    (lambda r: r["arm"][1]["per_fleet"].update(b={}), "arm 'DN': per_fleet.b: must be a table"),
    (lambda r: r["arm"][1]["per_fleet"]["d"].update(set="eval.every=4"),
     "arm 'DN': per_fleet.d.set: must be a list"),
    (lambda r: r["arm"][1].update(profiles=["very"]), "arm 'DN': profiles: a matrix arm runs "
     "on its fleets' profiles"),
    (lambda r: r["arm"][1].update(fleet=["b"]), "arm 'DN': fleet: not a matrix arm's key"),
    (lambda r: r["arm"][0].pop("reference"), "arm: exactly one [[arm]] needs reference = true"),
    (lambda r: r["arm"][0].update(fleets=["b"]), "arm 'DN': fleet 'd': the arm it is "
     "compared with, 'sync', does not run on it"),
    (lambda r: r["arm"][2].update(against="nope"), "arm 'DN vs DN': against: no arm 'nope'"),
    (lambda r: r.update(fleet={"b": {}}), "fleet: must be [[fleet]] tables"),
    (lambda r: r["fleet"][0].pop("profiles"), "fleet[0].profiles: must be a non-empty list"),
    (lambda r: r["fleet"][0].update(arms=["x"]), "fleet[0].arms: not a fleet's key"),
    (lambda r: r["fleet"][1].update(label=""), "fleet[1].label: must be a non-empty string"),
]


@pytest.mark.parametrize("change,message", REFUSED, ids=[m for _, m in REFUSED])
def test_a_bad_matrix_is_refused_in_one_line_naming_the_key(change, message):
    with pytest.raises(ConfigError) as info:
        matrix.expand(_edit(change), "sweep spec s.toml")
    text = str(info.value)
    assert text.startswith(f"sweep spec s.toml: {message}") and "\n" not in text, text


def test_a_bad_matrix_file_is_refused_before_any_run(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('db = "m.db"\nout = "m.md"\n[[fleet]]\nkey = "a"\nlabel = "a"\n'
                    'profiles = ["very"]\n[[arm]]\nlabel = "sync"\nreference = true\n'
                    'set = []\nfleets = ["b"]\n')
    with pytest.raises(ConfigError, match=r"^sweep spec .*m\.toml: arm 'sync': fleets: no "
                                          r"fleet 'b' \(the fleets: a\)$"):
        load_spec(path, quick=False)
