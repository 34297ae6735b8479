"""Property-based fuzzing of the config loader (fedlm.config_load) and the CLI (hypothesis).

Property: whatever the input — a TOML file, ``--set key=value`` strings, plain
data for ``from_dict`` — either a valid ``Config`` comes back or ``ConfigError``
is raised with a one-line message that names the offending key; never any
other exception. On the command line the same input ends with exit status 2
and one line on stderr, never a traceback, and nothing starts training.

The keys come from the dataclasses in fedlm/config/__init__.py (``dataclasses.fields``)
and from the built-in strategies' constructors, so new sections and settings
are fuzzed without touching this file.
"""

from __future__ import annotations

import os
import dataclasses
import datetime as dt
import inspect
import json
import math
import tomllib
from typing import Any, get_type_hints

import pytest
import tomli_w
from hypothesis import HealthCheck, assume, example, given, seed, settings
from hypothesis import strategies as st

from fedlm import config_load, presets
from fedlm.sim import fleet
from fedlm.config import Config
from fedlm.errors import ConfigError
from fedlm.strategies import registry
from tests.fuzzing import RANDOM, SEED, time_bound

# Derandomized: the same examples every time (FEDLM_FUZZ_RANDOM=1 explores; pin finds with @example)
FUZZ = settings(max_examples=120, deadline=None, database=None,
                derandomize=not os.environ.get("FEDLM_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
FUZZ_SMALL = settings(FUZZ, max_examples=50)

# ---------------------------------------------------------------------------
# The keys: every leaf of Config, derived from the dataclasses
# ---------------------------------------------------------------------------


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _leaves() -> list[tuple[str, Any, Any]]:
    """(dotted key, annotated type, default) for every setting of Config."""
    out = []
    hints = get_type_hints(Config)
    for f in dataclasses.fields(Config):
        typ = hints[f.name]
        if dataclasses.is_dataclass(typ):
            sub = get_type_hints(typ)
            out += [(f"{f.name}.{g.name}", sub[g.name], _default(g))
                    for g in dataclasses.fields(typ)]
        elif f.name != "outer":
            out.append((f.name, typ, _default(f)))
    # outer.*: whatever the built-in strategies' constructors take
    outer: dict[str, Any] = {}
    for cls in registry.STRATEGIES.values():
        init_hints = {k: v for klass in reversed(cls.__mro__) if "__init__" in vars(klass)
                      for k, v in get_type_hints(klass.__init__).items()}
        for name, p in registry.settings_of(cls).items():
            if name not in outer:
                default = p.default if p.default is not inspect.Parameter.empty else 1.0
                outer[name] = (init_hints.get(name, float), default)
    out += [(f"outer.{k}", t, d) for k, (t, d) in sorted(outer.items())]
    return out


LEAVES = _leaves()
SECTIONS = sorted(f.name for f in dataclasses.fields(Config)
                  if dataclasses.is_dataclass(get_type_hints(Config)[f.name]))


def test_the_fuzzer_sees_every_section():
    assert {"inner", "data", "eval", "fleet", "sim"} <= set(SECTIONS)
    assert {k.split(".")[0] for k, _, _ in LEAVES if "." in k} >= set(SECTIONS) | {"outer"}


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------

def _words() -> list[str]:
    """Strings that mean something to some field (so valid configs come up too)."""
    return sorted({*presets.PRESETS, *fleet.PRESETS, *fleet.REGIONS, *registry.STRATEGIES,
                   *registry.LOCAL_STEPS, "auto", "cpu", "cuda", "virtual", "wall", "iid",
                   "by-play", "dirichlet", "context", "disk", "shakespeare", "hf:x",
                   "text:*.txt", "tokens", "uniform", "train", "text", "runs/x.db", "",
                   " ", "ünïcødé", "名前", "a\nb", "\t", "\x00", "=", "[", "'", '"'})


WORDS = _words()
HUGE_INTS = [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**30, -(10**30), 10**400]
ODD_FLOATS = [0.0, -0.0, 1e-300, 5e-324, 1e308, math.inf, -math.inf, math.nan, 0.5, 1.0, 2.0]

ints = st.one_of(st.integers(-3, 40), st.sampled_from(HUGE_INTS), st.integers())
floats = st.one_of(st.floats(-2, 10), st.sampled_from(ODD_FLOATS), st.floats())
texts = st.one_of(st.sampled_from(WORDS), st.text(max_size=20))
dates = st.one_of(st.dates(), st.times(), st.datetimes())
scalars = st.one_of(ints, floats, st.booleans(), texts, dates)
toml_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(["a", "lr", "steps", "x", ""])
                                            | st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)


def value_for(typ: Any) -> st.SearchStrategy:
    """Mostly well-typed values (in and out of range), sometimes anything at all."""
    typed = {
        int: ints, float: st.one_of(floats, ints), bool: st.booleans(), str: texts,
        list[float]: st.lists(st.one_of(floats, ints), max_size=4),
        list[int]: st.lists(ints, max_size=4),
        list[str]: st.lists(texts, max_size=4),
    }.get(typ, toml_values)
    return st.one_of(typed, typed, typed, toml_values)


@st.composite
def mutations(draw, max_keys: int = 5) -> dict[str, Any]:
    """{dotted key: value} for a few keys; values typed or not."""
    chosen = draw(st.lists(st.sampled_from(LEAVES), min_size=1, max_size=max_keys,
                           unique_by=lambda leaf: leaf[0]))
    out = {}
    for key, typ, default in chosen:
        out[key] = draw(st.one_of(st.just(default), value_for(typ), value_for(typ)))
    return out


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for key, value in flat.items():
        node = raw
        *parents, leaf = key.split(".")
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[leaf] = value
    return raw


def toml_inline(value: Any) -> str:
    """A TOML inline value (what a user would type after --set key=)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        # TOML basic strings take JSON's escapes, but not surrogate pairs nor a raw DEL
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_inline(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_inline(k)} = {toml_inline(v)}"
                               for k, v in value.items()) + "}"
    raise TypeError(value)


# ---------------------------------------------------------------------------
# The property
# ---------------------------------------------------------------------------

def _prefixes(key: str) -> set[str]:
    parts = key.split(".")
    return {".".join(parts[:n]) for n in range(1, len(parts) + 1)}


def names_a_key(message: str, keys) -> bool:
    """The message starts with one of ``keys`` (or a section above it, or an item in it)."""
    unquoted = message[1:] if message[:1] in "'\"" else message  # repr() picks either quote
    # --set aliases (profile -> fleet.preset) apply to --set only: a table key is
    # named as written
    for key in {k for name in keys for k in (name, config_load.ALIASES.get(name, name))}:
        forms = _prefixes(key) | set(key.split("."))
        for p in forms | {repr(f) for f in forms}:
            if any(m.startswith((p + ":", p + "[", p + ".")) for m in (message, unquoted)):
                return True
    return False


def outcome(fn, keys=None) -> Config | None:
    """Run ``fn``: a Config, or None after a well-formed ConfigError. Anything else fails."""
    try:
        cfg = fn()
    except ConfigError as exc:
        message = str(exc)
        assert len(message.splitlines()) == 1 and message == message.strip(), repr(message)
        assert len(message) < 2000, message[:200]
        if keys is not None:
            assert names_a_key(message, keys), (message, keys)
        return None
    assert isinstance(cfg, Config)
    check_valid(cfg)
    return cfg


def error_of(fn, keys=None) -> str:
    """The message of the ConfigError that ``fn`` must raise (checked like ``outcome``)."""
    with pytest.raises(ConfigError) as info:
        fn()
    assert outcome(fn, keys) is None
    return str(info.value)


def check_valid(cfg: Config) -> None:
    """A config that loads is one the rest of fedlm can use as is."""
    settings_ = cfg.to_dict()
    outer = settings_.pop("outer")  # kept as given: an int for a float setting stays an int
    for value in _walk(outer):
        if isinstance(value, float):
            assert math.isfinite(value), cfg
    for value in _walk(settings_):
        if isinstance(value, float):
            assert math.isfinite(value), cfg
        if isinstance(value, int):
            assert -(2**63) <= value < 2**63, cfg
        if isinstance(value, str):
            assert "\x00" not in value, cfg
    assert config_load.from_json(cfg.to_json()) == cfg  # stored in the run db, replayed from it
    assert config_load.from_dict(tomllib.loads(tomli_w.dumps(cfg.to_dict()))) == cfg  # `fedlm config`


def _walk(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)
    else:
        yield value


# ---------------------------------------------------------------------------
# The loader
# ---------------------------------------------------------------------------

@FUZZ
@given(mutations(max_keys=1))
def test_one_key_from_dict(flat):
    outcome(lambda: config_load.from_dict(nest(flat)), keys=flat)


@FUZZ
@given(mutations())
def test_several_keys_from_dict(flat):
    outcome(lambda: config_load.from_dict(nest(flat)), keys=flat)


@seed(SEED)
@RANDOM
@given(mutations())
def test_random_round_of_keys(flat):
    """New examples each run (tests/fuzzing.py: the seed is in the suite's last lines)."""
    with time_bound(20.0):
        outcome(lambda: config_load.from_dict(nest(flat)), keys=flat)


@FUZZ
@given(mutations())
def test_several_keys_as_set_overrides(flat):
    overrides = [f"{k}={toml_inline(v)}" for k, v in flat.items()]
    cfg = outcome(lambda: config_load.load(None, overrides), keys=flat)
    if cfg is not None:  # the same keys as a file give the same config
        assert cfg == outcome(lambda: config_load.from_dict(nest(flat)))


@FUZZ
@given(mutations(), st.sampled_from(["toml", "inline"]))
def test_several_keys_as_toml_file(tmp_path, flat, how):
    path = tmp_path / "c.toml"
    if how == "toml":
        try:
            text = tomli_w.dumps(nest(flat))
        except (TypeError, ValueError):  # tomli_w cannot write some (e.g. a key of only ws)
            text = "\n".join(f"{json.dumps(k)} = {toml_inline(v)}" for k, v in flat.items())
    else:  # dotted keys, inline values
        text = "\n".join(f"{k} = {toml_inline(v)}" for k, v in flat.items())
    path.write_text(text, encoding="utf-8")
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:  # e.g. a time of day with a zone: not TOML
        outcome(lambda: config_load.load(path))
        return
    outcome(lambda: config_load.load(path), keys=flat)


@FUZZ
@given(st.dictionaries(st.sampled_from([k for k, _, _ in LEAVES] + SECTIONS + ["outer"])
                       | st.text(max_size=8), toml_values, max_size=5))
@example({"data": {"'\x1f": 0}})  # found in CI: repr() quoted the path with double quotes
def test_structure_junk_from_dict(raw):
    outcome(lambda: config_load.from_dict(nest(raw)), keys=raw)


@FUZZ_SMALL
@given(st.one_of(toml_values, st.none(), st.integers(), st.text()))
def test_not_a_table_at_all(raw):
    assume(not isinstance(raw, dict))
    outcome(lambda: config_load.from_dict(raw))
    outcome(lambda: config_load.from_json(json.dumps(raw, default=str)))


@FUZZ
@given(st.lists(st.one_of(
    st.text(max_size=30),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from([k for k, _, _ in LEAVES]
                                                       + list(config_load.ALIASES) + SECTIONS),
              st.text(max_size=30)),
    st.builds(lambda k, v: f"{k}={v}", st.text(max_size=12), st.text(max_size=12)),
), max_size=4))
def test_junk_set_strings(overrides):
    outcome(lambda: config_load.load(None, overrides))


@FUZZ
@given(st.text(max_size=300))
def test_parse_value_never_raises(text):
    config_load.parse_value(text)


@pytest.mark.parametrize("text", ["[" * 3000, "{a=" * 3000, "1" * 5000, "-" + "9" * 4400,
                                  "0x" + "f" * 5000, "1e400", "nan", "'''", "\x00", "1979-05-27"],
                         ids=lambda t: repr(t[:12]))
def test_parse_value_odd_corners(text):
    config_load.parse_value(text)
    outcome(lambda: config_load.load(None, [f"inner.steps={text}"]), keys=["inner.steps"])
    outcome(lambda: config_load.load(None, [f"fleet.step_times={text}"]), keys=["fleet.step_times"])


@FUZZ_SMALL
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(
    lambda b: b.decode("latin-1"))))
def test_junk_toml_text(tmp_path, text):
    path = tmp_path / "junk.toml"
    path.write_text(text, encoding="utf-8")
    outcome(lambda: config_load.load(path))


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"[" * 3000 + b"\n",
                                     b"x = " + b"9" * 5000, b"a = 1\na = 2",
                                     "é = 1".encode("latin-1")], ids=lambda b: repr(b[:12]))
def test_unreadable_config_files(tmp_path, content):
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    assert error_of(lambda: config_load.load(path)).startswith("config: ")


def test_config_path_that_is_a_directory_or_unreadable(tmp_path):
    assert "is a directory, not a TOML file" in error_of(lambda: config_load.load(tmp_path))
    assert "no such file" in error_of(lambda: config_load.load(str(tmp_path / "a\x00b")))


@pytest.mark.parametrize("override, fragment", [
    ("inner.lr=inf", "inner.lr: must be a finite number, got inf"),
    ("inner.lr=nan", "inner.lr: must be a finite number, got nan"),
    ("time_budget=inf", "time_budget: must be a finite number"),
    ("fleet.step_times=[1, inf]", "fleet.step_times[1]: must be a finite number"),
    ("inner.lr=" + "9" * 400, "inner.lr: must be a finite number"),
    ("seed=" + "9" * 30, "seed: must be an integer in [-2**63, 2**63)"),
    ("seed=" + "0x" + "f" * 5000, "seed: must be an integer in [-2**63, 2**63)"),
    ("outer.lr=nan", "outer.lr: must be a finite number"),
    ("outer.lr='fast'", "outer.lr: expected float, got 'fast'"),
    ("outer.nesterov=1979-05-27", "outer.nesterov: expected bool"),
    ("strategy=:Nope", "strategy: cannot load ':Nope'"),
    ("strategy=.:Nope", "strategy: cannot load '.:Nope'"),
    ('name="a\\u0000b"', "name: must not contain NUL characters"),
], ids=lambda v: repr(v[:40]))
def test_fuzzer_findings_are_refused_naming_the_key(override, fragment):
    key = override.split("=")[0]
    assert fragment in error_of(lambda: config_load.load(None, [override]), keys=[key])


def test_unprintable_keys_are_shown_quoted():
    with pytest.raises(ConfigError) as info:
        config_load.load(None, ["a\nb=1"])
    assert str(info.value).startswith("'a\\nb': unknown key")
