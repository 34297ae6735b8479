"""The contract of a kind of server (``fedlm.servers.kind.ServerKind``, issue 60): at most
fifteen hooks, separate from the one-server kind (``Server``); ``ServerCalls`` calls a
kind through them and the kind's data alone; and a kind written against the contract
alone (below: one server, from scratch, no ``Server`` under it) trains, replays and
resumes to the one-server kind's weights bit for bit."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest

from fedlm import servers
from fedlm.servers.kind import ServerKind
from tests.support import trains_replays_and_resumes

ROOT = Path(__file__).resolve().parents[1]

HOOKS = {"worker_links", "start", "versions_wanted", "wants_job", "next_job", "dispatch",
         "send", "reference", "accept", "take", "lose", "deliver", "on_timer", "state_dict",
         "load_state_dict"}
# what every kind has beside its hooks: its data, and its services to itself
HAS = {"serves", "Settings", "check", "strategy", "policy", "params", "version",
       "model_bytes", "up_bytes", "uploads", "new_version", "take_messages", "take_alarms"}


def test_the_contract_is_fifteen_hooks_separate_from_the_one_server_kind():
    own = {n for n, v in vars(ServerKind).items() if callable(v) and not n.startswith("_")
           and n not in ("Settings", "check", "new_version", "describe", "queue", "take_messages",
                         "wake_in", "take_alarms")}
    assert own == HOOKS and len(HOOKS) <= 15
    assert not issubclass(ServerKind, servers.Server)  # the one-server kind is built on it
    assert "seen" not in inspect.getsource(ServerKind)  # the one server's bookkeeping


def test_server_calls_reach_a_kind_through_its_hooks_and_data_alone():
    tree = ast.parse((ROOT / "fedlm" / "servers" / "calls.py").read_text())
    reached = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
               and isinstance(node.value, ast.Attribute) and node.value.attr == "_server"}
    reached |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id == "s"}
    assert reached and reached <= HOOKS | HAS, sorted(reached - HOOKS - HAS)


FROM_SCRATCH = '''
"""One server written against the contract alone (fedlm.servers.kind.ServerKind)."""
from dataclasses import replace

from fedlm.params import num_bytes
from fedlm.servers import Sent, ServerKind
from fedlm.sim import wire_sizes


class Plain(ServerKind):
    def start(self, params, fleet):
        self.params, self.seen = params, {}
        self.model_bytes = num_bytes(params)
        self.up_bytes = wire_sizes.encoded_bytes(params, self.cfg.network)
        self.strategy.start(params, num_workers=len(fleet))

    def wants_job(self, worker, version):
        return self.strategy.wants_job(worker, version=version)

    def next_job(self, worker, version, allow):
        steps = allow(self.policy.local_steps(worker))
        return steps if steps > 0 else None

    def send(self, job, start):
        return Sent(job, start, self.model_bytes, self.up_bytes)

    def dispatch(self, job, events, index):
        sent = self.send(job, self.params)
        timing = None if events is None else events.timing(job.worker, job.local_steps, index)
        self.strategy.on_dispatch(job.worker, version=job.base_version)
        return replace(sent, timing=timing)

    def reference(self, job):
        return self.params

    def accept(self, job):
        self.seen[job.worker] = job.base_version
        return self.version - job.base_version

    def take(self, update):
        return self.strategy.on_update(update, self.params)

    def lose(self, worker, *, job_id, reason):
        return self.strategy.on_job_lost(worker, job_id=job_id, reason=reason,
                                         params=self.params)

    def state_dict(self):
        return {"params": self.params, "version": self.version, "seen": dict(self.seen),
                "strategy": self.strategy.state_dict(), "outbox": [], "next_key": 0}

    def load_state_dict(self, state, checkpoint=None):
        self.params, self.version = state["params"], state["version"]
        self.seen = dict(state["seen"])
        self.strategy.load_state_dict(state["strategy"])
'''


@pytest.fixture
def plain(tmp_path, monkeypatch):
    (tmp_path / "plain_kind.py").write_text(FROM_SCRATCH)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("plain_kind", None)


@pytest.mark.parametrize("strategy", ["diloco", "delayed-nesterov"])
def test_a_kind_written_against_the_contract_alone_runs_as_the_one_server(tmp_path, plain,
                                                                          strategy):
    from fedlm import store

    sets = (f"strategy={strategy}", "workers=3", "updates=4", "profile=very")
    ours = trains_replays_and_resumes(tmp_path / "plain", *sets,
                                      "server=plain_kind:Plain", stop_at=2)
    one = trains_replays_and_resumes(tmp_path / "one", *sets, "server=one", stop_at=2)
    (a,), (b,) = store.list_runs(ours), store.list_runs(one)
    assert a["final_hash"] == b["final_hash"]  # the one-server kind's weights, bit for bit


def test_the_strategy_base_is_what_every_strategy_has():
    """Its name, source and hooks (at most 12 members); what only some strategies declare
    (synchronous, wants_grace, default_server, ...) is read in one place, with defaults."""
    from fedlm.strategies.base import Strategy
    from fedlm.strategies.delayed_nesterov import DelayedNesterov
    from fedlm.strategies.diloco_dylu import DiLoCoDyLU
    from fedlm.strategies.halos import Halos
    from fedlm.strategies.traits import Traits, traits

    members = [n for n in vars(Strategy) if not n.startswith("_")]
    assert len(members) <= 12 and {"name", "source", "start", "on_update"} <= set(members)
    assert traits(Strategy) == Traits()  # asynchronous, one server, the config's policy
    assert traits(DelayedNesterov).wants_grace and not traits(Halos).wants_grace
    assert traits(DiLoCoDyLU).synchronous and traits(DiLoCoDyLU).default_local_steps == "dylu"
    assert traits(Halos()).default_server["kind"] == "regions"  # an instance reads alike


BAD_SETTINGS = '''
from dataclasses import dataclass
from fedlm.servers import Server

class NotDC(Server):
    class Settings:
        pass

@dataclass(frozen=True)
class Req:
    period: float

class Required(Server):
    Settings = Req

@dataclass(frozen=True)
class Boom:
    x: int = 1
    def __post_init__(self):
        raise RuntimeError("boom")

class Raises(Server):
    Settings = Boom
'''


@pytest.mark.parametrize("kind, says", [
    ("NotDC", "^server: NotDC.Settings is not a dataclass"),
    ("Required", r"^server.period: must be given \(server 'bad_settings:Required' has no "
                 r"default for it\)$"),
    ("Raises", r"^server: the settings of 'bad_settings:Raises' failed \(RuntimeError: boom\)$")])
def test_a_kind_s_settings_that_cannot_be_made_are_one_line(tmp_path, monkeypatch, kind, says):
    from fedlm.errors import ConfigError
    from tests.conftest import tiny_config

    (tmp_path / "bad_settings.py").write_text(BAD_SETTINGS)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=says):
        tiny_config(f"server.kind=bad_settings:{kind}")
    sys.modules.pop("bad_settings", None)
