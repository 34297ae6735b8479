"""The server protocol (``fedlm.servers``): the engine, replay and resume reach every
kind of server through ``ServerCalls`` alone and name no method family; a kind calls
its strategies only through the Strategy base class, which keeps only hooks that
several strategies use; the config names the kind."""

import ast
import json
import re
from pathlib import Path

import pytest

from fedlm import servers
from fedlm.errors import ConfigError
from fedlm.servers.regions import RegionServers
from fedlm.servers.streamed import StreamedServer
from fedlm.strategies.base import Strategy
from fedlm.strategies.halos import Halos
from fedlm.strategies.registry import STRATEGIES
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parent.parent
# the engine, resume (runner, checkpoints, the engine's state) and replay
CORE = [*sorted((ROOT / "fedlm" / "engine").glob("*.py")),
        *(ROOT / "fedlm" / f for f in ("replay.py", "runner.py", "checkpoint.py"))]
# server kinds and strategies by name: what the core must not branch on, or mention
FAMILIES = re.compile(r"halos|stream|fragment|two[_ -]level|region server|gossip|\bpush|"
                      + "|".join(rf"\b{re.escape(n)}\b" for n in STRATEGIES), re.IGNORECASE)


def test_the_engine_replay_and_resume_name_no_method_family():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in CORE
            for n, line in enumerate(p.read_text().splitlines(), 1) if FAMILIES.search(line)]
    assert hits == []


def test_the_grep_would_see_a_family_named_in_the_core():
    assert FAMILIES.search("if self.stream is not None:")
    assert FAMILIES.search("if strategy.two_level:")
    assert FAMILIES.search('if cfg.strategy == "fedbuff":')
    assert FAMILIES.search('bw = link.up_bw if kind == "push" else link.down_bw')
    assert not FAMILIES.search("steps = self.server.job_steps(w, version, policy)")


# the calls of the protocol: ServerCalls's public methods, none of them a field
PROTOCOL = {n for n, v in vars(servers.ServerCalls).items()
            if callable(v) and not n.startswith("_")}
# what the engine may know of the kind's strategy and job sizes: the facade's properties
FACADE = {n for n, v in vars(servers.ServerCalls).items() if isinstance(v, property)}


def _server_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every ``<...>.server.name`` and ``server.name`` read."""
    return [(node.lineno, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and ((isinstance(node.value, ast.Attribute) and node.value.attr == "server")
                 or (isinstance(node.value, ast.Name) and node.value.id == "server"))]


def test_the_engine_and_replay_read_no_server_attribute_outside_the_protocol():
    # 16: `offered` came with client sampling (a round drawn from the workers present);
    # 17: `drains_messages`, a kind whose messages carry updates (examples/pipelined.py);
    # 18: `rang`, a wake-up a kind asked of the run's clock (a deadline, a period)
    assert len(PROTOCOL) <= 18 and {"dispatch", "finished", "lost", "arrived"} <= PROTOCOL
    # the strategy and the job sizes, read only through these (never the strategy itself)
    assert FACADE == {"policy", "synchronous", "wants_grace", "draws_rounds", "awaits_draw",
                      "strategy_name", "outer_lr"}
    reads = {p.relative_to(ROOT): _server_reads(ast.parse(p.read_text())) for p in CORE}
    assert sum(map(len, reads.values())) > 20  # the check looks where the calls are
    stray = [f"{p}:{line}: server.{name}" for p, found in reads.items()
             for line, name in found if name not in PROTOCOL | FACADE]
    assert stray == []
    # and none reaches past the calls to the kind, nor builds one of its own
    text = "\n".join(p.read_text() for p in CORE)
    builds = {p.name for p in CORE if "servers.build(" in p.read_text()}
    # the run's entry point builds the server (it stores its summary first), replay its
    # own; every engine is assembled in one place
    assert "._server" not in text and builds == {"runner.py", "replay.py", "assembly.py"}
    assert "self.strategy" not in text  # the engine keeps no strategy of its own
    made = {p.name for p in CORE + sorted((ROOT / "fedlm").rglob("*.py"))
            + sorted((ROOT / "experiments").rglob("*.py")) + [ROOT / "tests" / "support.py"]
            if re.search(r"(?<!class )\bEngine\(", p.read_text())}
    assert made == {"assembly.py"}


def test_the_check_would_see_a_field_read():
    reads = _server_reads(ast.parse("x = self.server.seen.get(w)\ny = server.seq"))
    assert sorted(name for _, name in reads if name not in PROTOCOL) == ["seen", "seq"]


def _strategy_calls(path: Path) -> set[str]:
    """What a kind's code calls on the strategies it composes."""
    return set(re.findall(r"(?:self\.strategy|self\.top|self\.parts\[[^\]]*\]|\bpart|"
                          r"\bstrategy)\.(\w+)\(", path.read_text()))


def test_server_kinds_call_their_strategies_through_the_strategy_base_alone():
    base = {n for n, v in vars(Strategy).items() if callable(v) and not n.startswith("_")}
    kinds = sorted((ROOT / "fedlm" / "servers").glob("*.py"))
    kinds += [ROOT / "examples" / f for f in ("noloco_example.py", "overlap_dc_example.py",
                                                   "pipelined.py", "semi_sync.py")]
    calls = {p.name: _strategy_calls(p) for p in kinds}
    assert calls["regions.py"] >= {"on_update", "on_job_lost", "on_dispatch", "start"}
    assert {p: c - base for p, c in calls.items() if c - base} == {}


def test_halos_holds_no_hook_of_its_own():
    # its levels are instances of it that the region servers compose: it is a strategy
    # and nothing else (the engine's transfers do not know its words either)
    own = [n for n, v in vars(Halos).items() if callable(v) and not n.startswith("_")
           and n not in vars(Strategy)]
    assert own == []
    assert "push" not in (ROOT / "fedlm" / "engine" / "transfers.py").read_text()


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


def test_the_config_names_the_kind_and_its_default_comes_from_the_strategy():
    for sets, name, kind in (((), "one", servers.Server),
                            (("stream.fragments=2",), "streamed", StreamedServer),
                            (("strategy=halos",), "regions", RegionServers),
                            (("strategy=delayed-nesterov", "server=regions"), "regions",
                             RegionServers),
                            (("strategy=delayed-nesterov", "server=one"), "one",
                             servers.Server)):
        cfg = tiny_config(*sets)
        assert (cfg.server.kind, servers.server_class(cfg)) == (name, kind)
    # a stored run's config of an older fedlm has no server: it loads with the default
    from fedlm.config_load import from_json

    stored = json.loads(tiny_config("strategy=halos").to_json())
    del stored["server"]
    assert from_json(json.dumps(stored)).server.kind == "regions"


@pytest.mark.parametrize("sets, message", [
    (["server=two"], r"^server: unknown kind 'two' \(known: one, streamed, regions; or "
                     r"package.module:Class\)$"),
    (["server=fedlm.config:Config"], r"^server: 'fedlm.config:Config' is not a kind of "
                                     r"server \(a subclass of fedlm.servers.Server or "
                                     r"ServerKind\)$"),
    (["server=no_such_mod:X"], r"^server: cannot import 'no_such_mod'"),
    (["server=streamed"], r"^server: has streaming rounds to run"),
    (["stream.fragments=2", "server=one"], r"^stream.fragments: streaming rounds run on "
                                           r"server = 'streamed' \(or a kind made from it\), "
                                           r"not 'one'"),
    (["server=regions"], r"^server: runs an asynchronous strategy \(halos, delayed-nesterov"),
    # a strategy whose kind is half the method: its settings would apply nowhere
    (["strategy=halos", "server=one"], r"^server: strategy 'halos' runs on its own kind of "
                                       r"server \('regions', its default_server, or one made "
                                       r"from it\): leave server unset, got 'one'$"),
    (["strategy=halos", "server=pipelined:PipelinedServer"], r"^server: strategy 'halos' runs "
                                                              r"on its own kind of server"),
    (["strategy=semi_sync:SemiSyncFill", "server=one"], r"^server: strategy "
                                                        r"'semi_sync:SemiSyncFill' runs on its "
                                                        r"own kind of server"),
    (["strategy=desloc:DesLoc", "server=one"], r"^server: strategy 'desloc:DesLoc' runs on "
                                               r"its own kind of server"),
])
def test_a_kind_the_config_cannot_have_is_refused_in_one_line(sets, message, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    with pytest.raises(ConfigError, match=message):
        tiny_config(*sets)


def test_a_kind_made_from_the_strategys_own_serves_it(tmp_path, monkeypatch):
    (tmp_path / "my_regions.py").write_text(
        "from fedlm.servers.regions import RegionServers\n"
        "class Mine(RegionServers):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tiny_config("strategy=halos", "server=my_regions:Mine", "workers=4")
    assert cfg.server.kind == "my_regions:Mine"
    assert cfg.server.settings["merge"] == 0.25  # HALoS's settings for the kind made from its own


def test_a_strategy_that_still_names_its_server_the_old_way_is_told_how(tmp_path,
                                                                        monkeypatch):
    (tmp_path / "old_plug.py").write_text(
        "from fedlm.strategies.diloco import DiLoCo\n"
        "class A(DiLoCo):\n    name = 'a'\n    server = 'old_plug:S'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^strategy: names its server in `server` "
                                          r"\('old_plug:S'\), which fedlm no longer reads"):
        tiny_config("strategy=old_plug:A")


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
    assert b.parts[0].rounds.dispatched == {0} and b.parts[1].rounds.dispatched == set()
    assert all(pb.opt_state is pa["opt_state"] for pb, pa in zip(b.parts, parts))


def test_servers_of_their_own_refuse_a_shared_server_link_in_one_line():
    # region servers' messages go over each region's own link (fedlm.engine.transfers):
    # the shared server link and the hierarchical network cannot carry them, and say so
    import pytest

    from fedlm.errors import ConfigError

    for sets, key in ((["network.server_up=1e6"], "network.server_up"),
                      (["network.hierarchical=true"], "network.topology")):
        with pytest.raises(ConfigError, match=rf"^{key}: server 'regions' times each worker"):
            tiny_config("strategy=halos", *sets)


def test_servers_build_is_the_one_place_a_strategy_is_made_from_a_config():
    """The engine, replay, the dry run, resume and the CLI take a built server; a kind
    that composes several instances asks its base for them (``Server.new_strategy``)."""
    made = {}
    for path in sorted((ROOT / "fedlm").rglob("*.py")):
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and getattr(n.func, "attr", getattr(n.func, "id", None)) == "build_strategy"]
        if calls:
            made[str(path.relative_to(ROOT))] = len(calls)
    assert made == {"fedlm/servers/__init__.py": 1, "fedlm/servers/protocol.py": 1}


def test_the_base_server_keys_queues_and_checkpoints_messages_for_every_kind():
    """``Server.queue`` numbers messages, ``take_messages`` hands each over once, and a
    checkpoint keeps the queue and the counter (a resumed run's keys go on, none reused);
    a checkpoint without them (a kind that sent none, an older fedlm) starts both empty."""
    from collections import OrderedDict

    import torch

    from fedlm.sim import fleet
    from fedlm.strategies import registry

    cfg = tiny_config("workers=2", "strategy=diloco")
    params = OrderedDict(w=torch.zeros(2))

    def fresh():
        s = servers.build(cfg, registry.build_strategy(cfg.strategy, cfg.outer))
        s.start(params, fleet.node_profiles(cfg))
        return s
    a = fresh()
    assert a.take_messages() == []
    assert [a.queue(0, None, 10, "push"), a.queue(None, 1, 20, "model", 1.5)] == [0, 1]
    taken = a.take_messages()
    assert [(m.key, m.source, m.destination, m.nbytes, m.kind, m.seconds) for m in taken] \
        == [(0, 0, None, 10, "push", None), (1, None, 1, 20, "model", 1.5)]
    assert a.take_messages() == []
    a.queue(1, None, 30, "push")
    b = fresh()
    b.load_state_dict(a.state_dict())
    assert [m.key for m in b.take_messages()] == [2] and b.queue(None, None, 0, "t") == 3
    old = a.state_dict()
    del old["outbox"], old["next_key"]
    c = fresh()
    c.load_state_dict(old)
    assert c.take_messages() == [] and c.queue(None, None, 0, "t") == 0
