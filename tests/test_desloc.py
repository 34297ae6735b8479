"""examples/desloc.py: DES-LOC's parameter side (Iacob et al. 2025, arXiv 2505.22549):
each parameter group is replaced by the workers' plain mean every K of its rounds and
trains locally in between. Pinned by hand on a two-tensor model over three rounds, with
lost jobs and the server's evaluated mean; the half-life numbers the paper picks its
periods from; and a run that trains, replays and resumes bit for bit."""

from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedlm.errors import ConfigError
from fedlm.strategies.base import Update
from tests.conftest import tiny_config
from tests.support import scalar as _p, scalar_update as _update, trains_replays_and_resumes
from tests.support import value as _v

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _ab(a: float, b: float) -> OrderedDict:
    """A model (or outer gradient) of two one-number tensors, ``a`` and ``b``."""
    return OrderedDict(a=torch.tensor([a], dtype=torch.float64),
                       b=torch.tensor([b], dtype=torch.float64))


def _pair(t) -> tuple[float, float]:
    return float(t["a"][0]), float(t["b"][0])


def _u(worker: int, a: float, b: float) -> Update:
    return Update(worker=worker, job_id=0, base_version=0, outer_grad=_ab(a, b), tokens=1,
                  local_steps=1, staleness=0)


def _round(s, local, grads: dict):
    """One round: every worker in ``grads`` dispatched, then its update, in that order."""
    for w in grads:
        assert s.wants_job(w, version=0)
        s.on_dispatch(w, version=0)
    out = None
    for k, (w, g) in enumerate(grads.items()):
        out = s.on_update(_u(w, *g), local)
        assert (out is None) == (k < len(grads) - 1)  # the barrier: only the last closes it
    return out


def test_each_group_is_replaced_by_the_mean_on_its_period_and_local_in_between():
    """a: period 1 (every round, K_x = H); b: period 2. x_i ← mean_j(x_j − g_j) for a
    group due this round, x_i ← x_i − g_i for one that is not."""
    from desloc import DesLoc

    s = DesLoc(group_periods="b=2")  # a: outer.period, 1
    assert (s.period_of("a"), s.period_of("b")) == (1, 2)
    s.start(_ab(1.0, 1.0), num_workers=2)
    local = [_ab(1.0, 1.0)] * 2
    # round 1: a synced, mean(1 − 0.2, 1 − 0.6) = 0.6; b local: 1 − 0.4, 1 + 0.2
    local = _round(s, local, {0: (0.2, 0.4), 1: (0.6, -0.2)})
    assert _pair(local[0]) == pytest.approx((0.6, 0.6))
    assert _pair(local[1]) == pytest.approx((0.6, 1.2))
    # round 2: a synced, mean(0.6 − 0.1, 0.6 − 0.3) = 0.4; b synced too (2 mod 2 = 0):
    # mean(0.6 − 0.2, 1.2 − 0.4) = 0.6, for both workers
    local = _round(s, local, {0: (0.1, 0.2), 1: (0.3, 0.4)})
    assert _pair(local[0]) == pytest.approx((0.4, 0.6))
    assert _pair(local[1]) == pytest.approx((0.4, 0.6))
    # round 3: b local again: 0.6 − 0.5, 0.6 − 0.1; a: mean(0.4 − 0.0, 0.4 − 0.2) = 0.3
    local = _round(s, local, {0: (0.0, 0.5), 1: (0.2, 0.1)})
    assert _pair(local[0]) == pytest.approx((0.3, 0.1))
    assert _pair(local[1]) == pytest.approx((0.3, 0.5))
    assert s.rounds.round == 3


def test_the_synced_value_is_the_plain_mean_of_the_replies_not_token_weighted():
    """E_m is 1/M Σ_m: tokens do not weight it (fedlm's DiLoCo weights by tokens)."""
    from desloc import DesLoc

    s = DesLoc()
    s.start(_p(1.0), num_workers=2)
    for w in (0, 1):
        s.on_dispatch(w, version=0)
    local = [_p(1.0)] * 2
    s.on_update(Update(worker=0, job_id=0, base_version=0, outer_grad=_p(0.2), tokens=300,
                       local_steps=1, staleness=0), local)
    local = s.on_update(Update(worker=1, job_id=0, base_version=0, outer_grad=_p(0.6),
                               tokens=100, local_steps=1, staleness=0), local)
    assert _v(local[0]) == _v(local[1]) == pytest.approx(0.6)


def test_a_worker_out_of_the_round_takes_the_synced_groups_and_keeps_its_own():
    """Worker 2 misses the deadline in round 1: a (due) is set to the mean of the two
    replies for it too; b (not due) stays where its worker left it. An error is retried
    in the same round; a round whose every job was lost starts over."""
    from desloc import DesLoc

    s = DesLoc(group_periods="b=2")
    s.start(_ab(1.0, 1.0), num_workers=3)
    local = [_ab(1.0, 1.0), _ab(1.0, 1.0), _ab(1.0, 3.0)]
    for w in (0, 1, 2):
        s.on_dispatch(w, version=0)
    assert s.on_job_lost(1, job_id=1, reason="error", params=local) is None
    assert s.wants_job(1, version=0)  # it takes the round's job again
    s.on_dispatch(1, version=0)
    assert s.on_update(_u(0, 0.2, 0.4), local) is None
    assert s.on_update(_u(1, 0.4, 0.2), local) is None
    local = s.on_job_lost(2, job_id=2, reason="deadline", params=local)  # closes it
    got = [v for x in local for v in _pair(x)]
    assert got == pytest.approx([0.7, 0.6, 0.7, 0.8, 0.7, 3.0])
    # round 2: every job lost, nothing to merge: it starts over, the models unchanged
    for w in (0, 1, 2):
        s.on_dispatch(w, version=1)
    for w in (0, 1, 2):
        assert s.on_job_lost(w, job_id=3 + w, reason="deadline", params=local) is None
    assert s.rounds.round == 1 and all(s.wants_job(w, version=1) for w in (0, 1, 2))


def test_its_server_starts_each_job_from_its_workers_model_and_evaluates_their_mean():
    from fedlm import servers
    from fedlm.sim import fleet
    from fedlm.strategies import registry
    from desloc import DesyncServer

    cfg = tiny_config("strategy=desloc:DesLoc", "workers=2", "outer.period=2")
    assert cfg.server.kind == "desloc:DesyncServer"  # the strategy's default_server
    server = servers.build(cfg, registry.build_strategy(cfg.strategy, cfg.outer))
    assert isinstance(server, DesyncServer)
    server.start(_p(1.0), fleet.node_profiles(cfg))
    for w in (0, 1):
        server.dispatched(w, 0)
    assert server.take(_update(0, 0.2)) is None
    mean = server.take(_update(1, 0.6))  # round 1 of period 2: each keeps its own
    assert (_v(server.start_of(0)), _v(server.start_of(1))) == pytest.approx((0.8, 0.4))
    assert _v(mean) == pytest.approx(0.6)  # evaluated: mean_i x_i
    for w in (0, 1):
        server.dispatched(w, 1)
    assert server.take(_update(0, 0.1)) is None
    mean = server.lose(1, job_id=3, reason="retired")  # round 2 synced: 0.7 for both
    assert (_v(server.start_of(0)), _v(server.start_of(1))) == pytest.approx((0.7, 0.7))
    assert _v(mean) == pytest.approx(0.7) and server.retired == [1]
    state = server.state_dict()
    assert [_v(x) for x in state["local"]] == pytest.approx([0.7, 0.7])


def test_the_half_lives_the_paper_picks_its_periods_from():
    """τ½(β) = ln ½ / ln β: β₂ = 0.999 gives 692.8 steps, the K_v = 692 of the paper's
    Rosenbrock toy (M = 256, K_x = K_u = 192); β₁ = 0.9 gives 6.58."""
    from desloc import half_life

    assert half_life(0.999) == pytest.approx(692.80, abs=0.01) and int(half_life(0.999)) == 692
    assert half_life(0.9) == pytest.approx(6.579, abs=0.001)
    assert half_life(0.95) == pytest.approx(13.51, abs=0.01)
    with pytest.raises(ValueError):
        half_life(1.0)


@pytest.mark.parametrize("setting, says", [
    ("outer.period=0", "outer.period"),
    ("outer.group_periods=b", "outer.group_periods"),
    ("outer.group_periods=b=0", "outer.group_periods"),
    ("outer.group_periods=b=x", "outer.group_periods")])
def test_a_bad_setting_is_a_one_line_config_error(setting, says):
    with pytest.raises(ConfigError, match=says) as err:  # refused when the config loads
        tiny_config("strategy=desloc:DesLoc", setting)
    assert "\n" not in str(err.value)


def test_a_pattern_that_matches_no_parameter_is_refused_before_any_run():
    from desloc import DesLoc

    # when the config loads (its server kind's check), against the preset's parameter
    # names: nothing is stored, no worker started; the error names the setting itself
    with pytest.raises(ConfigError, match="^outer.group_periods: 'emb.*' matches no "
                                          "parameter .names: tok_emb.weight, ") as err:
        tiny_config("strategy=desloc:DesLoc", "outer.group_periods=emb.*=3")
    assert "\n" not in str(err.value)
    tiny_config("strategy=desloc:DesLoc", "outer.group_periods=*emb.*=3")  # it matches
    with pytest.raises(ValueError, match="outer.group_periods: 'emb.*' matches no"):
        DesLoc(group_periods="emb.*=3").start(_ab(1.0, 1.0), num_workers=2)  # and at start


def test_a_desloc_run_trains_replays_and_resumes_bit_for_bit(tmp_path):
    """Embeddings synced every 2 and 3 rounds, the rest every round: the resume at
    version 2 must restore every worker's own embeddings (DesyncServer's state)."""
    trains_replays_and_resumes(tmp_path, "strategy=desloc:DesLoc",
                               "outer.group_periods=tok_emb.*=2,pos_emb.*=3")


def test_the_contract_s_save_load_round_trip_through_its_server(tmp_path):
    """tests/test_contract.py's check (not in its list: examples/ strategies are added
    there by hand): state saved mid-run through the server's calls, loaded into a fresh
    one, continues exactly like the original, with a group out of period."""
    from fedlm import servers
    from fedlm.params import params_hash
    from fedlm.sim import fleet
    from fedlm.strategies import registry
    from tests.test_contract import Served, drive, params

    class DesLocServed(Served):
        def __init__(self, theta) -> None:  # Served with outer settings
            cfg = tiny_config("workers=3", "strategy=desloc:DesLoc")
            strategy = registry.build_strategy("desloc:DesLoc", {"group_periods": "w=2"})
            self.kind = servers.build(cfg, strategy)
            self.out, self.queue = [], []
            self.calls = servers.ServerCalls(
                self.kind, on_version=lambda v: self.out.append(params_hash(v.params)),
                on_messages=self.queue.extend)
            self.calls.start(theta, self.calls.links(fleet.node_profiles(cfg)))

    a = DesLocServed(params())
    drive(a, 3)  # one round of 3 workers: "w" (period 2) is out of sync now
    torch.save(a.state_dict(), tmp_path / "state.pt")
    b = DesLocServed(params())
    b.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    ha, hb = drive(a, 9, start_at=100), drive(b, 9, start_at=100)
    assert ha == hb and len(ha) == 3
