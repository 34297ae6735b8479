"""A sweep spec written as a matrix: fleets stated once, arms stated once, and each
arm run on each fleet, so that a study of A arms on F fleets is A + F tables instead
of A x F copies of the same settings.

    [[fleet]]
    key = "b"                    # what an arm's `fleets` and `per_fleet` name (default: label)
    label = "b halos net"        # its arms are labelled "b halos net: ARM"
    profiles = ["halos"]
    set = ["workers=8", "inner.steps=5"]           # before each arm's own set
    tune_set = ["fleet.device_trace=tuning.json"]  # before each arm's own (optional)

    [[arm]]
    label = "sync + fill"
    reference = true             # each fleet's reference
    set = ["strategy=diloco-fill", "eval.every=1"]
    tune = {"outer.lr" = [0.35, 0.7]}

    [[arm]]
    label = "HALoS + DyLU"
    fleets = ["b"]               # only these fleets (default: every fleet)
    set = ["strategy=halos", "local_steps=dylu"]
    per_fleet.b = {tune = {"outer.lr" = [1.6, 3.2]}}  # b's differences only

expands, fleet by fleet and arm by arm in the order written, into the ``[[arm]]`` list
the spec would otherwise spell out (``fedlm.sweep.spec`` reads that list as always):
``label`` "FLEET: ARM", the fleet's ``profiles``, ``set`` = the fleet's, the arm's, then
its ``per_fleet`` set (later wins where a key repeats), ``tune_set`` likewise, and a
``per_fleet`` ``tune`` in place of the arm's. The reference arm is each fleet's group
reference: every other arm of the fleet is compared with it (``against``, or the arm's
own ``against``, an arm label, on the same fleet), and on the first fleet it runs on it
is the spec's ``reference``. A spec without ``[[fleet]]`` tables is left as it is.
"""

from __future__ import annotations

import copy

from fedlm.errors import ConfigError

FLEET_KEYS = ("key", "label", "profiles", "set", "tune_set")
ARM_KEYS = ("label", "reference", "against", "set", "tune", "tune_set", "parts", "seeds",
            "fleets", "per_fleet")
PER_FLEET_KEYS = ("set", "tune", "tune_set")  # what may differ on one fleet


def expand(raw: dict, where: str) -> dict:
    """``raw`` (a spec as read from TOML) with its ``[[fleet]]`` x ``[[arm]]`` matrix
    written out as the ``[[arm]]`` list it stands for, and ``profiles`` (if the spec
    gives none) the fleets' in order; ``raw`` itself if it has no ``[[fleet]]``.
    A bad matrix is refused in one line naming the key (``ConfigError``)."""
    if "fleet" not in raw:
        return raw

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: {what}")

    fleets = _fleets(raw["fleet"], need)
    arms = raw.get("arm", [])
    need(isinstance(arms, list) and arms != [] and all(isinstance(a, dict) for a in arms),
         "arm: a matrix needs [[arm]] tables (each run on every fleet)")
    for k, arm in enumerate(arms):
        _check_arm(arm, k, fleets, need)
    stems = [a["label"] for a in arms]
    refs = [a["label"] for a in arms if a.get("reference") is True]
    need(len(refs) == 1, f"arm: exactly one [[arm]] needs reference = true (each fleet's "
         f"reference), got {len(refs)}")
    ref = next(a for a in arms if a["label"] == refs[0])
    out = []
    first_ref = True
    for key, fleet in fleets.items():
        for arm in arms:
            if key not in _fleets_of(arm, fleets):
                continue
            against = arm.get("against") or (None if arm is ref else ref["label"])
            need(against is None or against in stems, f"arm {arm['label']!r}: against: no "
                 f"arm {against!r} (a matrix arm names another arm's label, without its fleet)")
            if against is not None:
                other = next(a for a in arms if a["label"] == against)
                need(key in _fleets_of(other, fleets), f"arm {arm['label']!r}: fleet "
                     f"{key!r}: the arm it is compared with, {against!r}, does not run on it")
            out.append(_arm_on(fleet, arm, against, reference=arm is ref and first_ref))
            first_ref = first_ref and arm is not ref
    spec = {k: v for k, v in raw.items() if k != "fleet"}
    spec["arm"] = out
    spec.setdefault("profiles", list(dict.fromkeys(
        p for f in fleets.values() for p in f["profiles"])))
    return spec


def _arm_on(fleet: dict, arm: dict, against: str | None, reference: bool) -> dict:
    """``arm`` on ``fleet`` as the plain ``[[arm]]`` table it stands for: only the keys
    such a table would have (no ``tune_set`` when empty, ``reference`` only where true)."""
    diff = arm.get("per_fleet", {}).get(fleet["key"], {})
    out = {"label": f"{fleet['label']}: {arm['label']}"}
    if reference:
        out["reference"] = True
    if against is not None:
        out["against"] = f"{fleet['label']}: {against}"
    out["profiles"] = list(fleet["profiles"])
    out["set"] = [*fleet.get("set", []), *arm.get("set", []), *diff.get("set", [])]
    if "tune" in diff or "tune" in arm:
        out["tune"] = copy.deepcopy(diff.get("tune", arm.get("tune")))
    held_out = [*fleet.get("tune_set", []), *arm.get("tune_set", []), *diff.get("tune_set", [])]
    if held_out:
        out["tune_set"] = held_out
    for key in ("parts", "seeds"):
        if key in arm:
            out[key] = copy.deepcopy(arm[key])
    return out


def _fleets_of(arm: dict, fleets: dict) -> list[str]:
    """The keys of the fleets ``arm`` runs on: its ``fleets``, else every fleet."""
    return arm.get("fleets", list(fleets))


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _fleets(tables: object, need) -> dict[str, dict]:
    """The ``[[fleet]]`` tables by key (in the order written), each checked."""
    need(isinstance(tables, list) and tables != [] and all(isinstance(f, dict) for f in tables),
         "fleet: must be [[fleet]] tables (each with a label and profiles)")
    out = {}
    labels = set()
    for k, fleet in enumerate(tables):
        unknown = sorted(set(fleet) - set(FLEET_KEYS))
        need(not unknown, f"fleet[{k}].{unknown[0] if unknown else ''}: not a fleet's key "
             f"(a fleet has {', '.join(FLEET_KEYS)})")
        need(isinstance(fleet.get("label"), str) and fleet["label"].strip() != "",
             f"fleet[{k}].label: must be a non-empty string, got {fleet.get('label')!r}")
        fleet = {"key": fleet["label"], **fleet}  # (raw is not changed)
        key = fleet["key"]
        need(isinstance(key, str) and key.strip() != "", f"fleet[{k}].key: must be a "
             f"non-empty string, got {key!r}")
        need(key not in out, f"fleet[{k}].key: {key!r} twice (each fleet is stated once)")
        need(fleet["label"] not in labels, f"fleet[{k}].label: {fleet['label']!r} twice "
             f"(each fleet is stated once)")
        need(_strings(fleet.get("profiles")) and fleet["profiles"] != [],
             f"fleet[{k}].profiles: must be a non-empty list of profile names")
        for name in ("set", "tune_set"):
            need(_strings(fleet.get(name, [])), f"fleet[{k}].{name}: must be a list of "
                 f"key=value strings")
        out[key] = fleet
        labels.add(fleet["label"])
    return out


def _check_arm(arm: dict, k: int, fleets: dict, need) -> None:
    """A matrix arm's own keys: its fleets and per-fleet differences (the rest is checked
    as any ``[[arm]]``'s once expanded)."""
    need(isinstance(arm.get("label"), str) and arm["label"] != "",
         f"arm[{k}].label: must be a non-empty string")
    name = f"arm {arm['label']!r}"
    need("profiles" not in arm, f"{name}: profiles: a matrix arm runs on its fleets' "
         f"profiles (name the fleets instead: fleets = [...])")
    unknown = sorted(set(arm) - set(ARM_KEYS))
    need(not unknown, f"{name}: {unknown[0] if unknown else ''}: not a matrix arm's key "
         f"(an arm has {', '.join(ARM_KEYS)})")
    need(isinstance(arm.get("reference", False), bool), f"{name}: reference: must be true "
         f"or false, got {arm.get('reference')!r}")
    need(isinstance(arm.get("against", ""), str), f"{name}: against: must be an arm's "
         f"label, got {arm.get('against')!r}")
    on = arm.get("fleets", list(fleets))
    need(_strings(on) and on != [], f"{name}: fleets: must be a non-empty list of fleet "
         f"keys, got {on!r}")
    for key in on:
        need(key in fleets, f"{name}: fleets: no fleet {key!r} (the fleets: "
             f"{', '.join(fleets)})")
        need(on.count(key) == 1, f"{name}: fleets: {key!r} twice")
    diffs = arm.get("per_fleet", {})
    need(isinstance(diffs, dict), f"{name}: per_fleet: must be a table of fleet keys")
    for key, diff in diffs.items():
        need(key in fleets, f"{name}: per_fleet.{key}: no fleet {key!r} (the fleets: "
             f"{', '.join(fleets)})")
        need(key in on, f"{name}: per_fleet.{key}: the arm does not run on fleet {key!r} "
             f"(its fleets: {', '.join(on)})")
        need(isinstance(diff, dict) and diff != {}, f"{name}: per_fleet.{key}: must be a "
             f"table of what differs on that fleet ({', '.join(PER_FLEET_KEYS)})")
        unknown = sorted(set(diff) - set(PER_FLEET_KEYS))
        need(not unknown, f"{name}: per_fleet.{key}.{unknown[0] if unknown else ''}: not a "
             f"per-fleet difference (one of {', '.join(PER_FLEET_KEYS)})")
        for field in ("set", "tune_set"):
            need(_strings(diff.get(field, [])), f"{name}: per_fleet.{key}.{field}: must be "
                 f"a list of key=value strings")
        need(isinstance(diff.get("tune", {}), dict), f"{name}: per_fleet.{key}.tune: must "
             f"be a table of settings and their values")
