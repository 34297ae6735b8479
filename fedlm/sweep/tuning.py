"""One tuning budget for every arm of a sweep.

A comparison is only fair when no arm was tuned more than another. A spec with a
``[tuning]`` table gives every arm a grid (its ``tune``: settings and their values)
and the same budget of configurations; the sweep runs each arm's configurations on
the tuning seeds, chooses one per arm and profile by a stated rule, records it, and
runs the held-out seeds (the spec's ``seeds``) with that choice only::

    [tuning]
    seeds = [200]      # tuning seeds: never among the held-out ones
    budget = 4         # configurations per arm and profile, the same for every arm
    rule = "final"     # the lowest mean final perplexity over the tuning seeds

    [[arm]]
    label = "DN + DyLU"
    set = [...]
    tune = {"outer.lr" = [0.35, 0.7], "outer.momentum" = [0.8, 0.9]}

An arm's ``tune_set`` changes what its tuning runs see and the held-out runs do not
(other traces, say), so that configurations are held out from the tuning as seeds are.
A grid larger than the budget is searched at random (``budget`` of its
configurations, drawn from the arm's label: the same every time); a smaller one is
refused. A configuration with a tuning run that failed or diverged is not chosen.
A cell's run is named by its configuration (``ARM @ PROFILE [outer.lr=0.7, ...] seed
S``), so tuning and held-out runs are reused by name, and a different choice is a
different run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from dataclasses import dataclass

RULES = {"final": "the lowest mean final perplexity over the tuning seeds"}
MAX_BUDGET = 64


@dataclass(frozen=True)
class Choice:
    """What tuning chose for one arm on one profile."""

    config: tuple[str, ...]  # its --set overrides
    score: float  # the rule's value (mean final perplexity over the tuning seeds)
    scores: dict[tuple[str, ...], float | None]  # every configuration's (None: failed)


def settings_of(spec: dict) -> dict | None:
    """The spec's ``[tuning]`` table, or None for a sweep that tunes nothing."""
    return spec.get("tuning")


def flat(table: dict, prefix: str = "") -> dict:
    """``{"outer": {"lr": [..]}}`` (TOML's dotted keys) as ``{"outer.lr": [..]}``."""
    out = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        out.update(flat(value, f"{name}.") if isinstance(value, dict) else {name: value})
    return out


def _value(v) -> str:
    """A grid value as ``--set`` reads it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v) if isinstance(v, str) else repr(v)


def grid(arm: dict, budget: int) -> list[tuple[str, ...]]:
    """The arm's ``budget`` configurations, each as ``--set`` overrides in key order."""
    table = flat(arm.get("tune", {}))
    keys = sorted(table)
    every = [tuple(f"{k}={_value(v)}" for k, v in zip(keys, values))
             for values in itertools.product(*(table[k] for k in keys))]
    if len(every) <= budget:
        return every
    rng = random.Random(int(hashlib.sha256(arm["label"].encode()).hexdigest()[:16], 16))
    return [every[k] for k in sorted(rng.sample(range(len(every)), budget))]


def label(config: tuple[str, ...]) -> str:
    """A configuration as a run's name shows it: ``outer.lr=0.7, outer.momentum=0.9``."""
    return ", ".join(config)


def check(raw: dict, need) -> None:
    """The ``[tuning]`` table and every arm's grid: types, the budget met by every arm,
    tuning seeds apart from the held-out ones. ``need(ok, message)`` refuses."""
    t = raw["tuning"]
    need(isinstance(t, dict), "tuning: must be a [tuning] table")
    seeds = t.get("seeds")
    need(isinstance(seeds, list) and seeds != [] and
         all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**63 for s in seeds)
         and len(set(seeds)) == len(seeds),
         f"tuning.seeds: must be a non-empty list of distinct seeds, got {seeds!r}")
    need("seeds" in raw, "tuning: needs the held-out seeds too (top level `seeds`)")
    shared = sorted(set(seeds) & set(raw.get("seeds", [])))
    need(not shared, f"tuning.seeds: {shared} are also held-out seeds: a choice must be "
                     f"judged on seeds it was not made on")
    budget = t.get("budget")
    need(isinstance(budget, int) and not isinstance(budget, bool) and 1 <= budget <= MAX_BUDGET,
         f"tuning.budget: must be a whole number in [1, {MAX_BUDGET}], got {budget!r}")
    need(t.get("rule", "final") in RULES, f"tuning.rule: one of {sorted(RULES)}, "
                                          f"got {t.get('rule')!r}")
    for arm in raw.get("arm", []):
        name = f"arm {arm.get('label')!r}: tune"
        table = arm.get("tune")
        need(isinstance(table, dict) and table, f"{name}: every arm of a tuned sweep needs "
             f"a grid (settings and their values), so that each is tuned as much")
        for key, values in flat(table).items():
            need(isinstance(values, list) and values != [] and all(
                isinstance(v, (int, float, str)) for v in values),
                f"{name}.{key}: must be a non-empty list of numbers or strings")
            need(all(not isinstance(v, float) or math.isfinite(v) for v in values),
                 f"{name}.{key}: must hold finite numbers")
        size = math.prod(len(v) for v in flat(table).values())
        need(size >= budget, f"{name}: {size} configurations, fewer than the budget of "
                             f"{budget}: every arm is tuned on as many (add values, or "
                             f"lower tuning.budget)")


def choose(configs: list[tuple[str, ...]], finals: dict[tuple[str, ...], list[float | None]],
           seeds: int) -> Choice | None:
    """The configuration with the lowest mean final perplexity over the ``seeds``
    tuning seeds; ties go to the first in grid order. ``finals``: per configuration,
    an entry per run that ended: its final perplexity, or None where it failed or
    diverged (the configuration is then not chosen). No choice while a run has not
    ended, nor if no configuration finished on every seed."""
    if any(len(finals.get(c, [])) < seeds for c in configs):
        return None
    scores: dict[tuple[str, ...], float | None] = {}
    for config in configs:
        values = finals[config]
        ok = all(v is not None and math.isfinite(v) for v in values)
        scores[config] = sum(values) / len(values) if ok else None
    ranked = [c for c in configs if scores[c] is not None]
    if not ranked:
        return None
    best = min(ranked, key=lambda c: (scores[c], configs.index(c)))
    return Choice(best, scores[best], scores)


def section(spec: dict) -> list[str]:
    """The report's account of the tuning: the budget and rule, then per arm and profile
    the configurations tried, their scores and the choice (or why there is none)."""
    t = settings_of(spec)
    if t is None:
        return []
    chosen = spec.get("chosen", {})
    out = ["### Tuning", "",
           f"Every arm got the same budget: {t['budget']} configurations of its grid "
           f"(`tune`), each run on the tuning seeds {', '.join(map(str, t['seeds']))}; "
           f"chosen by {RULES[t.get('rule', 'final')]}. The held-out seeds ran the choice "
           f"alone.", "",
           "| arm | profile | chosen | its score | configurations (score; - failed or not run) |",
           "|---|---|---|---|---|"]
    for arm in spec["arm"]:
        for profile in arm.get("profiles", spec["profiles"]):
            if profile not in spec["profiles"]:
                continue
            c = chosen.get((arm["label"], profile))
            configs = grid(arm, t["budget"])
            tried = "; ".join(
                f"[{label(k)}] " + (f"{c.scores[k]:.3f}" if c and c.scores.get(k) is not None
                                    else "-") for k in configs)
            out.append(f"| {arm['label']} | {profile} | "
                       + (f"[{label(c.config)}] | {c.score:.3f}" if c else "none yet | -")
                       + f" | {tried} |")
    return out + [""]
