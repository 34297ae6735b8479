"""strategies/rounds.py: a synchronous round's bookkeeping (``Rounds``) pinned by hand on
one-number models, and checkpoints written before it existed (FedAvg's, the trimmed
mean's and DES-LOC's own layouts) loading and going on as they would have."""

from pathlib import Path

import pytest

from fedlm.strategies.base import DROPPED
from fedlm.strategies.fedavg import FedAvg
from fedlm.strategies.rounds import Rounds
from tests.support import scalar as _p, scalar_update as _update, value as _v

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def examples(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _reply(worker: int, g: float, base_version: int):
    u = _update(worker, g)
    return type(u)(**{**u.__dict__, "base_version": base_version})


def test_a_round_closes_when_its_last_job_is_in_or_out():
    r = Rounds()
    for w in range(3):
        assert r.wants_job(w)
        r.dispatch(w, 0)
    assert not r.wants_job(0)  # once per round
    assert r.arrived(_update(0, 0.1)) is False
    assert r.lost(1, "error") is False and r.wants_job(1)  # asked again in the round
    r.dispatch(1, 0)
    assert r.lost(2, "deadline") is False and not r.wants_job(2)  # out of the round
    assert r.arrived(_update(1, 0.2)) is True  # the last job in: it closes
    assert [u.worker for u in r.replies()] == [0, 1]
    r.closed()
    assert r.round == 1 and r.wants_job(2)


def test_a_round_short_of_min_replies_starts_over_and_a_late_reply_is_told_apart():
    r = Rounds(2, fraction=0.5, overcommit=2)  # drawn rounds: a late reply is told apart
    r.draw([0, 1, 2, 3])
    drawn = sorted(w for w in range(4) if r.wants_job(w))
    assert len(drawn) == 4 and r.keep == 2  # every worker dispatched, 2 kept
    for w in drawn:
        r.dispatch(w, 0)
    assert r.arrived(_update(0, 0.1)) is False
    for w in (1, 2):
        assert r.lost(w, "retired") is False
    assert r.lost(3, "departed") is False  # 1 reply of 2: it starts over
    assert r.failed_rounds == 1 and r.round == 0 and r.awaits_draw
    assert r.arrived(_reply(3, 0.5, base_version=-7)) is DROPPED and r.discarded == 1


def test_a_cut_round_closes_now_or_at_the_reply_that_brings_it_to_min_replies():
    r = Rounds(2, cut_by_server=True)
    for w in range(4):
        r.dispatch(w, 0)
    assert r.cut() == [] and r.overdue  # no reply yet: it waits on
    assert r.arrived(_update(2, 0.1)) is False
    assert r.arrived(_update(0, 0.3)) is True  # the second reply closes it
    assert [u.worker for u in r.replies()] == [0, 2]
    r.closed()
    assert not r.overdue
    r.dispatch(0, 1)
    assert r.arrived(_reply(1, 0.5, base_version=0)) is DROPPED  # cut from the last round
    assert r.arrived(_reply(0, 0.1, base_version=1)) is True  # the round's one job is in
    assert r.cut() == [] and not r.overdue  # nothing outstanding: nothing to cut


def test_a_fedavg_checkpoint_of_before_rounds_loads_and_closes_its_round_alike():
    # as strategies/fedavg.py wrote it before Rounds: workers 0-2 out, 0's reply in
    old = {"opt_state": ({},), "round": 4, "dispatched": [0, 1, 2],
           "results": {0: _update(0, 0.3)}, "dropped": [], "failed_rounds": 1,
           "drawn": None, "keep": 0, "round_version": 4, "discarded": 0, "carried": []}
    older = {k: old[k] for k in ("opt_state", "round", "dispatched", "results", "dropped",
                                 "failed_rounds")}  # before client sampling
    for state in (old, older):
        s = FedAvg()
        s.start(_p(1.0), num_workers=3)
        s.load_state_dict(state)
        assert s.rounds.round == 4 and s.rounds.failed_rounds == 1
        assert not any(s.wants_job(w, version=4) for w in range(3))
        assert s.on_update(_update(1, 0.6), _p(1.0)) is None
        assert _v(s.on_update(_update(2, 0.9), _p(1.0))) == pytest.approx(1.0 - 0.6)
        assert set(s.state_dict()) == set(old) | {"overdue"}  # the same layout, and one more


def test_a_trimmed_mean_checkpoint_of_before_rounds_loads_and_closes_its_round_alike(examples):
    from trimmed_mean_example import TrimmedMean

    s = TrimmedMean(trim=1)
    s.start(_p(1.0), num_workers=4)
    # its own barrier's layout: jobs outstanding, workers out, outer gradients in
    s.load_state_dict({"opt_state": s.opt_state, "running": [1, 2], "out": [3],
                       "grads": {0: _p(0.9)}})
    assert not any(s.wants_job(w, version=0) for w in range(4))
    assert s.on_update(_update(1, 0.1), _p(1.0)) is None
    new = s.on_update(_update(2, 0.5), _p(1.0))
    assert _v(new) == pytest.approx(1.0 - 0.5)  # 0.1, 0.5, 0.9 less the largest and smallest
    assert s.rounds.round == 1 and all(s.wants_job(w, version=1) for w in range(4))


def test_a_desloc_checkpoint_of_before_rounds_loads_with_its_round_count(examples):
    from desloc import DesLoc

    s = DesLoc(period=3)
    s.start(_p(0.0), num_workers=2)
    s.load_state_dict({"num_workers": 2, "rounds": 2, "periods": {"w": 3}, "running": [1],
                       "out": [], "grads": {0: _p(0.2)}})
    local = [_p(1.0), _p(3.0)]
    new = s.on_update(_update(1, 0.4), local)  # round 3: synced, the mean of both ends
    assert [_v(x) for x in new] == pytest.approx([(0.8 + 2.6) / 2] * 2)
    assert s.rounds.round == 3
