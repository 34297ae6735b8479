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
    assert servers.server_class(tiny_config("stream.fragments=2"), strategy_class("diloco")) \
        is StreamedServer
    assert servers.server_class(tiny_config("strategy=halos"), strategy_class("halos")) \
        is RegionServers


def test_a_streamed_checkpoint_of_an_older_fedlm_loads_into_the_per_fragment_instances():
    # Older checkpoints kept one FedAvg with a list of per-fragment optimizer states
    from collections import OrderedDict

    import torch

    from fedlm.sim import fleet
    from fedlm.strategies import registry

    cfg = tiny_config("workers=2", "strategy=diloco", "stream.fragments=2")
    params = OrderedDict((n, torch.zeros(2)) for n in ["tok_emb.weight", "blocks.0.a",
                                                        "blocks.1.a", "head.weight"])

    def fresh():
        s = servers.build(cfg, registry.build_strategy(cfg.strategy, cfg.outer))
        s.start(params, fleet.node_profiles(cfg))
        return s
    a = fresh()
    a.dispatched(0, 0)  # round 0 (fragment 0) is open, with worker 0 dispatched
    legacy = a.state_dict()
    parts = legacy.pop("parts")
    legacy["strategy"] = {**parts[0], "opt_state": [p["opt_state"] for p in parts]}
    b = fresh()
    b.load_state_dict(legacy)
    assert [p.state_dict().keys() for p in b.parts] == [p.keys() for p in parts]
    assert b.parts[0].dispatched == {0} and b.parts[1].dispatched == set()
    assert all(pb.opt_state is pa["opt_state"] for pb, pa in zip(b.parts, parts))


def test_servers_of_their_own_refuse_a_shared_server_link_in_one_line():
    # region servers' messages go over each region's own link (fedlm.engine.transfers):
    # the shared server link and the hierarchical network cannot carry them, and say so
    import pytest

    from fedlm.errors import ConfigError

    for sets, key in ((["network.server_up=1e6"], "network.server_up"),
                      (["network.hierarchical=true"], "network.topology")):
        with pytest.raises(ConfigError, match=rf"^{key}: 'halos'"):
            tiny_config("strategy=halos", *sets)
