"""One rule for how long a link takes (``fedlm.sim.links``): the simulator's jobs, the
engine's messages between servers and the planner all compute a transfer with it. And
one place for collectives (``fedlm.sim.collectives``): the paper's wall-clock model
(``fedlm.plan.walltime``) times its all-reduces there too."""

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from fedlm.plan import inputs as plan_inputs
from fedlm.plan.model import async_cycle
from fedlm.sim import collectives, fleet, links
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parent.parent


def _counting(monkeypatch, module) -> list:
    """Record every call of ``transfer_seconds`` made through ``module``."""
    calls, real = [], links.transfer_seconds

    def spy(nbytes, bandwidth, latency):
        calls.append((nbytes, bandwidth, latency))
        return real(nbytes, bandwidth, latency)
    monkeypatch.setattr(module, "transfer_seconds", spy)
    return calls


def test_the_simulators_job_transfers_are_the_links_rule(monkeypatch):
    calls = _counting(monkeypatch, fleet)
    region = fleet.Region("far", latency=0.25, down_bw=1e6, up_bw=5e5)
    profile = fleet.WorkerProfile(0, 1.0, 0.0, region)
    t = fleet.JobTimer([profile], seed=0).timing(0, steps=3, down_bytes=4_000_000,
                                                 up_bytes=1_000_000)
    assert t.download == links.transfer_seconds(4_000_000, 1e6, 0.25) == 4.25
    assert t.upload == links.transfer_seconds(1_000_000, 5e5, 0.25) == 2.25
    assert (4_000_000, 1e6, 0.25) in calls and (1_000_000, 5e5, 0.25) in calls


def test_messages_between_servers_are_timed_by_the_links_rule(monkeypatch):
    from fedlm.engine import transfers
    from fedlm.servers import Message

    calls = _counting(monkeypatch, transfers)
    profiles = fleet.node_profiles(tiny_config("workers=4", "fleet.topology={us = 2, eu = 2}"))
    st = transfers.ServerTransfers(tiny_config(), profiles, events=None, log=None)
    us, eu = st.links
    # to the fleet's server: up eu's link; from it: down; between two regions: both legs
    assert st.seconds(Message(0, 1, None, 8_000_000), now=0.0) == \
        links.transfer_seconds(8_000_000, eu.up_bw, eu.latency)
    assert st.seconds(Message(1, None, 1, 8_000_000), now=0.0) == \
        links.transfer_seconds(8_000_000, eu.down_bw, eu.latency)
    assert st.seconds(Message(2, 1, 0, 8_000_000), now=0.0) == \
        links.transfer_seconds(8_000_000, eu.up_bw, eu.latency) + \
        links.transfer_seconds(8_000_000, us.down_bw, us.latency)
    assert len(calls) == 4  # each leg once, through the rule


def test_the_planners_transfers_are_the_links_rule(monkeypatch):
    from fedlm.plan import model

    calls = _counting(monkeypatch, model)
    cfg = tiny_config("workers=4", "profile=geo")
    inp = plan_inputs.from_config(cfg, params=1e6)
    ph = async_cycle(inp)  # no shared server link: each worker's own link, at full rate
    c = inp.classes()
    assert np.array_equal(ph.download, links.transfer_seconds(inp.down_bytes(), c.down_bw,
                                                              c.latency))
    assert np.array_equal(ph.upload, links.transfer_seconds(inp.up_bytes(), c.up_bw, c.latency))
    assert len(calls) == 2


def test_overlap_hides_at_most_the_compute_ahead_for_floats_and_arrays():
    assert links.hidden_seconds(0.6, 5.0) == 0.6 and links.hidden_seconds(3.0, 0.5) == 0.5
    assert list(links.hidden_seconds(np.array([0.6, 3.0]), 0.5)) == [0.5, 0.5]


@pytest.mark.parametrize("path", ["fedlm/sim/fleet.py", "fedlm/engine/events.py",
                                  "fedlm/engine/transfers.py", "fedlm/plan/model.py"])
def test_no_transfer_divides_bytes_by_a_bandwidth_beside_its_own_latency(path):
    # the rule written out again (latency + bytes / bandwidth) is what this module ended
    tree = ast.parse((ROOT / path).read_text())
    for node in ast.walk(tree):  # docstrings may state the rule: drop them
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            node.body = body[1:] or [ast.Pass()]
    code = ast.unparse(tree)
    assert "transfer_seconds" in code or "hidden_seconds" in code
    assert not re.search(r"latency \+ [\w.\[\]'\"]+ / \(?\w+", code), path


@pytest.mark.parametrize("n", [2, 3, 8, 100, 4096])
def test_the_papers_allreduce_bound_is_the_rings_bandwidth_term(n):
    # latency charged once (A.2's ε) where the ring pays it at each of its 2(n - 1) hops
    assert collectives.allreduce_bound_seconds(3e9, n, 1.25e9, 0.0) == \
        pytest.approx(collectives.ring_seconds(3e9, n, 1.25e9, 0.0), rel=1e-12)
    assert collectives.allreduce_bound_seconds(3e9, n, 1.25e9, 0.01) == pytest.approx(
        collectives.ring_seconds(3e9, n, 1.25e9, 0.0) + 0.01, rel=1e-12)


def test_the_wall_clock_model_times_its_allreduces_in_collectives(monkeypatch):
    from fedlm.plan import walltime

    inp = walltime.WallInput(params=1e9, tokens=2e10, batch=1e6, chips=100, replicas=4)
    before = {a: walltime.walltime(inp, a).total for a in walltime.algorithms(inp)}
    calls, real = [], collectives.allreduce_bound_seconds

    def doubled(nbytes, n, bw, latency):
        calls.append((nbytes, n, bw, latency))
        return 2 * real(nbytes, n, bw, latency)
    monkeypatch.setattr(collectives, "allreduce_bound_seconds", doubled)
    after = {a: walltime.walltime(inp, a) for a in before}
    for a, w in after.items():
        assert w.total > before[a]
        assert w.total == pytest.approx(w.compute + 2 * (before[a] - w.compute), rel=1e-12)
    # the model (2 bytes a parameter) over W1 = 10 Gbit/s among all 100 chips: 2 GB
    assert (2e9, 100, 1.25e9, 1e-2) in calls
    code = (ROOT / "fedlm/plan/walltime.py").read_text()
    assert not re.search(r"\(1 - 1 / ", code)  # A.2 not written again beside it
