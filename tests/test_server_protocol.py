"""The server protocol (``fedlm.servers``): the engine, replay and resume reach every
kind of server through it and name no method family; the Strategy base class keeps
only hooks that several strategies use."""

import re
from pathlib import Path

from fedlm import servers
from fedlm.servers.regions import RegionServers
from fedlm.servers.streamed import StreamedServer
from fedlm.strategies.base import Strategy
from fedlm.strategies.registry import STRATEGIES, strategy_class
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parent.parent
# the engine, resume (runner, checkpoints, the engine's state) and replay
CORE = [*sorted((ROOT / "fedlm" / "engine").glob("*.py")),
        *(ROOT / "fedlm" / f for f in ("replay.py", "runner.py", "checkpoint.py"))]
# server kinds and strategies by name: what the core must not branch on, or mention
FAMILIES = re.compile(r"halos|stream|fragment|two[_ -]level|region server|gossip|"
                      + "|".join(rf"\b{re.escape(n)}\b" for n in STRATEGIES), re.IGNORECASE)


def test_the_engine_replay_and_resume_name_no_method_family():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in CORE
            for n, line in enumerate(p.read_text().splitlines(), 1) if FAMILIES.search(line)]
    assert hits == []


def test_the_grep_would_see_a_family_named_in_the_core():
    assert FAMILIES.search("if self.stream is not None:")
    assert FAMILIES.search("if strategy.two_level:")
    assert FAMILIES.search('if cfg.strategy == "fedbuff":')
    assert not FAMILIES.search("policy = self.model.job_steps(w, version, policy)")


def _overriders(hook: str) -> list[str]:
    return sorted(n for n, cls in STRATEGIES.items()
                  if any(hook in vars(k) for k in cls.__mro__[:-1] if k is not Strategy
                         and issubclass(k, Strategy)))


def test_every_optional_hook_of_the_strategy_base_is_used_by_several_strategies():
    # An optional hook that only one strategy overrides belongs to that strategy (or
    # to a server kind): the base class is what every strategy must read.
    optional = [name for name, v in vars(Strategy).items() if callable(v)
                and not name.startswith("_") and not getattr(v, "__isabstractmethod__", False)]
    assert "on_dispatch" in optional and "on_job_lost" in optional
    single = {hook: _overriders(hook) for hook in optional if len(_overriders(hook)) < 2}
    assert single == {}


def test_each_run_gets_the_server_kind_its_strategy_and_config_ask_for():
    assert servers.server_class(tiny_config(), strategy_class("diloco")) is servers.Server
    assert servers.server_class(tiny_config("outer.fragments=2"), strategy_class("diloco")) \
        is StreamedServer
    assert servers.server_class(tiny_config("strategy=halos"), strategy_class("halos")) \
        is RegionServers
