"""A sweep's spec: the TOML file that names the runs of a sweep, read and checked
whole (its shape, then every run's config) before the first run starts, and the
runs it plans (arm x profile x seed, with their names and ``--set`` overrides).

The spec names a run database, a markdown report, shared ``base`` overrides, the
``profiles`` to cross, and ``[[arm]]`` entries (``label``, ``set``; one arm is the
``reference``, the synchronous baseline). ``seeds`` (top level, or an arm's own)
runs every cell once per seed, each with ``seed=S`` set last so that it wins over
``base`` and the arm's ``set``; ``--seeds N`` replaces them all with 0..N-1.
Without either, a cell is one run with the seed its config gives, named as before
seeds existed (``ARM @ PROFILE``), so that stores of earlier sweeps are still
reused; with them, ``ARM @ PROFILE seed S``. ``[quick]`` holds overrides for
``--quick`` (``base`` added to the shared ones, ``profiles`` replacing them).
``[paper]`` maps arm labels to the paper's final perplexities per profile.
A spec may state its fleets once and its arms once (``[[fleet]]`` tables: a matrix,
``fedlm.sweep.matrix``); it is read as the ``[[arm]]`` list it stands for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from fedlm import config_load
from fedlm.errors import ConfigError
from fedlm.sweep import matrix, tuning


@dataclass(frozen=True)
class Planned:
    """One run of the sweep: an arm on a profile with a seed (and, in a tuned sweep,
    one configuration of the arm's grid: a tuning run, or the choice on a held-out seed)."""

    name: str
    profile: str
    arm: dict
    seed: int | None  # None: no ``seed=`` override (the spec gives no seeds)
    config: tuple[str, ...] = ()  # the configuration's --set overrides (tuned sweeps)
    tuning: bool = False  # a run on a tuning seed, not one of the report's


def run_name(arm: str, profile: str, seed: int | None = None,
             config: tuple[str, ...] = ()) -> str:
    """The name a cell's run is stored (and reused) under; without seeds, the name
    sweeps gave before seeds existed; with a configuration, it is in the name."""
    return (f"{arm} @ {profile}" + (f" [{tuning.label(config)}]" if config else "")
            + ("" if seed is None else f" seed {seed}"))


def seeds_of(spec: dict, arm: dict) -> list[int | None]:
    """The seeds ``arm`` runs with: its own ``seeds``, else the spec's, else one run
    with no seed override (``[None]``)."""
    return list(arm.get("seeds", spec.get("seeds", [None])))


def cells_of(spec: dict) -> list[Planned]:
    """Every run of the report: each arm on the spec's profiles (or the subset its own
    ``profiles`` names), once per seed. Seed by seed, so that an interrupted sweep
    has whole seeds done rather than every seed of a few arms; with one seed, in the
    order of profiles then arms, as always. In a tuned sweep each carries the arm's
    chosen configuration (``spec["chosen"]``; a cell whose arm is not chosen yet is
    named ``[tuning pending]`` and never found in the store)."""
    seeds = list(dict.fromkeys(s for arm in spec["arm"] for s in seeds_of(spec, arm)))
    chosen = spec.get("chosen", {})
    out = []
    for seed in seeds:
        for profile in spec["profiles"]:
            for arm in spec["arm"]:
                if profile not in arm.get("profiles", spec["profiles"]) \
                        or seed not in seeds_of(spec, arm):
                    continue
                if tuning.settings_of(spec) is None:
                    out.append(Planned(run_name(arm["label"], profile, seed), profile, arm, seed))
                    continue
                choice = chosen.get((arm["label"], profile))
                config = choice.config if choice else ("tuning pending",)
                out.append(Planned(run_name(arm["label"], profile, seed, config), profile,
                                   arm, seed, config if choice else ()))
    return out


def tuning_cells(spec: dict) -> list[Planned]:
    """Every tuning run: each arm's configurations on its profiles and the tuning seeds."""
    t = tuning.settings_of(spec)
    if t is None:
        return []
    return [Planned(run_name(arm["label"], profile, seed, config), profile, arm, seed, config,
                    tuning=True)
            for seed in t["seeds"] for profile in spec["profiles"] for arm in spec["arm"]
            if profile in arm.get("profiles", spec["profiles"])
            for config in tuning.grid(arm, t["budget"])]


def composed(arm: dict) -> list[dict]:
    """An arm declared as a composition (``parts``: named lists of overrides) as the arms
    that isolate each part: the whole (every part), then each part alone; an arm without
    parts as itself. So a method made of several changes (MuLoCo: Muon inside, a 2-bit
    exchange) is never credited with what one part alone does."""
    parts = arm.get("parts")
    if not parts:
        return [arm]
    base = {k: v for k, v in arm.items() if k != "parts"}
    whole = dict(base, set=[*arm["set"], *(kv for p in parts.values() for kv in p)],
                 parts_of=list(parts))
    return [whole, *(dict(base, label=f"{arm['label']}: {name} alone", set=[*arm["set"], *kv],
                          part_of=arm["label"], reference=False) for name, kv in parts.items())]


def overrides(spec: dict, cell: Planned) -> list[str]:
    """The ``--set`` overrides of ``cell``'s run, in the order they apply: the
    spec's base, the profile, the arm's own, then the seed (last: it wins)."""
    seed = [] if cell.seed is None else [f"seed={cell.seed}"]
    held_out = cell.arm.get("tune_set", []) if cell.tuning else []  # e.g. the tuning traces
    return [*spec.get("base", []), f"profile={cell.profile}", *cell.arm["set"], *held_out,
            *cell.config, *seed]


def reference_of(spec: dict, arm: dict) -> str:
    """The label of the arm ``arm`` is compared with: its ``against``, else the
    spec's reference (``reference = true``)."""
    if arm.get("against"):
        return arm["against"]
    if any(a.get("against") == arm["label"] for a in spec["arm"]):
        return arm["label"]  # the reference of a group of its own
    return next(a["label"] for a in spec["arm"] if a.get("reference"))


def load_spec(path: str | Path, quick: bool, seeds: int | None = None) -> dict:
    """The sweep spec at ``path``, its ``[quick]`` version if ``quick``, checked: its
    shape, then every run's config, so that a bad spec fails in one line
    (``ConfigError``, naming the spec and the field) before the first run starts.
    ``seeds`` (``--seeds N``) replaces the spec's seeds, and every arm's, by 0..N-1."""
    where = f"sweep spec {path}"
    spec = matrix.expand(config_load.read_toml(path, "sweep spec"), where)
    _check_shape(spec, where)
    spec["arm"] = [part for arm in spec["arm"] for part in composed(arm)]
    for key in ("db", "out", "arm", "profiles"):
        if key not in spec:
            raise ConfigError(f"{where}: missing {key!r}")
    if sum(bool(a.get("reference")) for a in spec["arm"]) != 1:
        raise ConfigError(f"{where}: exactly one [[arm]] needs reference = true")
    labels = [a["label"] for a in spec["arm"]]
    for arm in spec["arm"]:
        if arm.get("against", arm["label"]) not in labels:
            raise ConfigError(f"{where}: arm {arm['label']!r}: against names no arm "
                              f"({arm['against']!r})")
    if quick:
        q = spec.get("quick", {})
        if "arms" in q:  # --quick runs only these arms
            unknown = sorted(set(q["arms"]) - set(labels))
            if unknown:
                raise ConfigError(f"{where}: quick.arms: no arm {unknown[0]!r}")
            spec["arm"] = [a for a in spec["arm"] if a["label"] in q["arms"]]
        spec["base"] = [*spec.get("base", []), *q.get("base", [])]
        spec["profiles"] = q.get("profiles", spec["profiles"])
        spec["db"] = q.get("db", spec["db"])
        spec["out"] = q.get("out", spec["out"])
    if not spec["profiles"]:
        raise ConfigError(f"{where}: profiles: must name at least one profile")
    if seeds is not None:
        check_seeds_count(seeds)
        spec["seeds"] = list(range(seeds))
        for arm in spec["arm"]:
            arm.pop("seeds", None)
        shared = sorted(set(spec["seeds"]) & set(spec.get("tuning", {}).get("seeds", [])))
        if shared:
            raise ConfigError(f"--seeds {seeds}: {shared} are tuning seeds too: a choice "
                              f"must be judged on seeds it was not made on")
    for owner, key in [(spec, "seeds"), *((a, "seeds") for a in spec["arm"])]:
        if len(owner.get(key, [])) > MAX_SEEDS:  # as many as --seeds allows
            name = "seeds" if owner is spec else f"arm {owner['label']!r}: seeds"
            raise ConfigError(f"{where}: {name}: at most {MAX_SEEDS} seeds, got "
                              f"{len(owner[key])}")
    checked = set()
    for cell in [*tuning_cells(spec), *cells_of(spec)]:  # each config as `fedlm run` loads it
        if (cell.profile, cell.arm["label"], cell.config) in checked:
            continue  # the seed alone cannot make it invalid: _check_shape checked each
        checked.add((cell.profile, cell.arm["label"], cell.config))
        try:
            config_load.load(None, overrides(spec, cell))
        except ConfigError as exc:
            raise ConfigError(f"{where}: arm {cell.arm['label']!r} @ {cell.profile}: "
                              f"{exc}") from None
    return spec


def only_arms(spec: dict, texts: list[str]) -> dict:
    """``spec`` with the arms whose label contains one of ``texts`` (any case), and each
    one's reference, kept: a long study run a part at a time. Run names come from the
    labels, so the full spec later reuses these runs, and each kept arm is compared with
    the arm it is compared with in the full spec."""
    if any(not t.strip() for t in texts):
        raise ConfigError("--arms: an empty text names every arm: leave --arms out to run "
                          "them all")
    wanted = [t.casefold() for t in texts]
    kept = [a for a in spec["arm"] if any(t in a["label"].casefold() for t in wanted)]
    if not kept:
        labels = "; ".join(a["label"] for a in spec["arm"])
        raise ConfigError(f"--arms: no arm's label contains {' or '.join(map(repr, texts))} "
                          f"(the arms: {labels})")
    refs = {reference_of(spec, a) for a in kept}
    arms = [a for a in spec["arm"] if a in kept or a["label"] in refs or a.get("reference")]
    part = {**spec, "arm": arms, "arms_only": list(texts)}
    part["arm"] = [a if reference_of(part, a) == reference_of(spec, a)
                   else {**a, "against": reference_of(spec, a)} for a in arms]
    return part


MAX_SEEDS = 1024  # --seeds' bound (fedlm/cli/parser.py), for a spec's lists too


def check_seeds_count(n: int) -> None:
    """Refuse a ``--seeds`` count below 1 (``ConfigError``)."""
    if n < 1:
        raise ConfigError(f"--seeds: must be at least 1, got {n}")


def _check_shape(raw: dict, where: str) -> None:
    """The types of what ``load_spec`` reads (tables, strings, lists of strings), so
    that a wrong one is named rather than failing as a KeyError or TypeError later."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: {what}")

    def strings(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    quick_part = raw.get("quick", {})
    need(isinstance(quick_part, dict), "quick: must be a [quick] table")
    for part, prefix in ((raw, ""), (quick_part, "quick.")):
        for key in ("db", "out"):
            need(isinstance(part.get(key, ""), str), f"{prefix}{key}: must be a string")
            if key in part:
                need(part[key].strip() != "", f"{prefix}{key}: must be a path, got {part[key]!r}")
        need(strings(part.get("base", [])), f"{prefix}base: must be a list of key=value strings")
        need(strings(part.get("profiles", [])), f"{prefix}profiles: must be a list of names")
    arms = raw.get("arm", [])
    need(isinstance(arms, list) and all(isinstance(a, dict) for a in arms),
         "arm: must be [[arm]] tables")
    for k, arm in enumerate(arms):
        need(isinstance(arm.get("label"), str) and arm["label"] != "",
             f"arm[{k}].label: must be a non-empty string")
        need(strings(arm.get("set")), f"arm[{k}].set: must be a list of key=value strings")
        need(isinstance(arm.get("reference", False), bool), f"arm[{k}].reference: must be "
             f"true or false")
        need(strings(arm.get("profiles", [])), f"arm[{k}].profiles: must be a list of names")
        need(isinstance(arm.get("against", ""), str), f"arm[{k}].against: must be an arm's label")
        need(strings(arm.get("tune_set", [])), f"arm[{k}].tune_set: must be a list of key=value "
             f"strings (what its tuning runs change: inputs held out from the tuning)")
        parts = arm.get("parts", {})
        need(isinstance(parts, dict) and (not parts or len(parts) >= 2) and all(
            strings(v) and v for v in parts.values()), f"arm[{k}].parts: a table of at least "
             f"two named lists of key=value strings (each part of the composition)")
        if "seeds" in arm:
            _check_seeds(arm["seeds"], f"arm[{k}].seeds", need)
            # else its runs could pair with no reference run: those have no seed
            need("seeds" in raw, f"arm[{k}].seeds: needs the spec's own seeds too (top "
                 f"level, e.g. seeds = [0, 1, 2])")
    if "seeds" in raw:
        _check_seeds(raw["seeds"], "seeds", need)
    if "tuning" in raw:
        tuning.check(raw, need)
    else:
        need(not any("tune" in a for a in arms), "arm.tune: a grid needs a [tuning] table "
             "(its seeds, budget and rule)")
    need(isinstance(raw.get("deadline", 1.0), (int, float)) and not isinstance(
        raw.get("deadline"), bool) and 0 < raw.get("deadline", 1.0) < math.inf,
         f"deadline: the equal-time point, virtual seconds > 0, got {raw.get('deadline')!r}")
    need(strings(quick_part.get("arms", [])), "quick.arms: must be a list of arm labels")
    labels = [a["label"] for a in arms] + [f"{a['label']}: {p} alone" for a in arms
                                            for p in a.get("parts", {})]
    need(len(set(labels)) == len(labels), "arm: labels must be unique (a composition's "
         "parts are arms 'LABEL: PART alone')")


def _check_seeds(value: object, key: str, need) -> None:
    """A ``seeds`` list: distinct ints, at least one (a bool is not a seed, though
    Python counts it as an int). Each in [0, 2**63): numpy's generators refuse a
    negative seed, and the run store holds 64 signed bits."""
    need(isinstance(value, list) and value != [], f"{key}: must be a non-empty list of "
         f"integers, got {value!r}")
    need(all(isinstance(s, int) and not isinstance(s, bool) for s in value),
         f"{key}: must be a list of integers, got {value!r}")
    need(all(0 <= s < 2**63 for s in value), f"{key}: each seed must be in [0, 2**63), "
         f"got {value!r}")
    need(len(set(value)) == len(value), f"{key}: seeds must be distinct, got {value!r}")
