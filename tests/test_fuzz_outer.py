"""Fuzzing every strategy's own settings (``outer.*``), the built-in ones and the example
plug-ins alike: whatever value a key is given, the config is refused in one line
(``ConfigError``) or accepted, never another exception, within a time bound; and an
accepted one holds no NaN or infinity. (A probe found ``outer.max_staleness = -1``
accepted, a run that dropped every update and stalled 206 s later, and NoLoCo's
``outer.gamma = nan`` accepted.) Derandomized like tests/test_fuzz_config.py, plus a
random round (tests/fuzzing.py)."""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import given, seed
from hypothesis import strategies as st

from fedlm import config_load
from fedlm.errors import ConfigError
from fedlm.strategies import registry
from fedlm.strategies.base import Strategy
from tests.fuzzing import RANDOM, SEED, time_bound
from tests.test_fuzz_config import FUZZ_SMALL

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@contextmanager
def examples_on_the_path() -> Iterator[None]:
    """examples/ importable inside the block only, and its modules forgotten after: other
    tests of this process check that a plug-in does not load without it."""
    stems = {p.stem for p in EXAMPLES.glob("*.py")}
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield
    finally:
        sys.path.remove(str(EXAMPLES))
        for stem in stems:
            sys.modules.pop(stem, None)


def _strategies() -> list[str]:
    """Every built-in strategy and every strategy class of examples/."""
    names = list(registry.STRATEGIES)
    with examples_on_the_path():
        for path in sorted(EXAMPLES.glob("*.py")):
            module = importlib.import_module(path.stem)
            names += [f"{path.stem}:{k}" for k, v in vars(module).items()
                      if isinstance(v, type) and issubclass(v, Strategy)
                      and v.__module__ == path.stem and not inspect.isabstract(v)]
    return names


STRATEGIES = _strategies()
odd = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                st.integers(min_value=-10**20, max_value=10**20),
                st.sampled_from([-1, 0, 1, 2, 1e-300, 1e30, "", "x", True]))


@st.composite
def settings_of_a_strategy(draw):
    name = draw(st.sampled_from(STRATEGIES))
    with examples_on_the_path():
        keys = sorted(registry.settings_of(registry.strategy_class(name)))
    chosen = draw(st.lists(st.sampled_from(keys), max_size=2, unique=True)) if keys else []
    return name, {k: draw(odd) for k in chosen}


def _check(name: str, outer: dict) -> None:
    sets = ["model=tiny", "workers=4", f"strategy={name}"]
    sets += [f"outer.{k}={v!r}".replace("'", '"') if isinstance(v, str)
             else f"outer.{k}={str(v).lower() if isinstance(v, bool) else v}"
             for k, v in outer.items()]
    with time_bound(20), examples_on_the_path():
        try:
            cfg = config_load.load(None, sets)
        except ConfigError as exc:
            assert "\n" not in str(exc) and str(exc), repr(exc)
            return
    for key, value in cfg.outer.items():
        assert not (isinstance(value, float) and not math.isfinite(value)), (key, value)


@FUZZ_SMALL
@given(settings_of_a_strategy())
def test_a_strategys_settings_are_refused_in_one_line_or_accepted_finite(drawn):
    _check(*drawn)


@RANDOM
@seed(SEED)
@given(settings_of_a_strategy())
def test_a_strategys_settings_random_round(drawn):
    _check(*drawn)


@pytest.mark.parametrize("name, key, value", [
    ("fedasync_example:FedAsync", "max_staleness", -1),
    ("fedasync_example:FedAsync", "a", -1),
    ("noloco_example:NoLoCo", "gamma", "nan"),
])
def test_the_probes_cases_are_refused(name, key, value):
    with examples_on_the_path(), pytest.raises(ConfigError, match=rf"^outer.{key}: must be"):
        config_load.load(None, ["model=tiny", "workers=4", f"strategy={name}",
                                f"outer.{key}={value}"])
