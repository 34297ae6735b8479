"""examples/far_workers.py and ``dylu-rtt``: asynchrony built for far workers. Each arrival
of FarDN is normalised by its steps (FedNova), weighted by 1/sqrt(1 + its age in rounds)
and dropped past max_age rounds (Ringmaster), before delayed Nesterov, pinned by hand;
dylu-rtt gives no job less compute than its own round trip; a run replays and resumes."""

import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedlm.strategies.base import FleetFacts, Update
from fedlm.strategies.local_steps import DyLU, DyLURtt
from tests.support import trains_replays_and_resumes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _u(g: float, steps: int, staleness: int) -> Update:
    return Update(worker=0, job_id=0, base_version=0, outer_grad=OrderedDict(w=torch.tensor([g])),
                  tokens=1, local_steps=steps, staleness=staleness)


def test_each_arrival_is_normalised_weighted_by_age_or_dropped_then_delayed_nesterov():
    from far_workers import FarDN

    s = FarDN(lr=1.0, momentum=0.0, buffer_size=1, max_age=2.0)  # DN with N = 1, β = 0: SGD
    s.on_fleet(FleetFacts(0, (1.0, 1.0), inner_steps=10))
    theta = OrderedDict(w=torch.tensor([0.0]))
    s.start(theta, num_workers=2)
    # 20 steps, 2 versions old = 1 round: g · 10/20 / sqrt(2)
    theta = s.on_update(_u(1.0, 20, 2), theta)
    assert float(theta["w"]) == pytest.approx(-0.5 / math.sqrt(2.0))
    # fresh, 5 steps: g · 10/5
    before = float(theta["w"])
    theta = s.on_update(_u(0.25, 5, 0), theta)
    assert float(theta["w"]) == pytest.approx(before - 0.5)
    # 6 versions = 3 rounds > max_age 2: dropped, no step
    assert s.on_update(_u(5.0, 10, 6), theta) is None


def test_each_part_of_the_merge_switches_off_alone():
    from far_workers import FarDN

    s = FarDN(lr=1.0, momentum=0.0, buffer_size=1, normalize=False, decay=False, max_age=0)
    s.on_fleet(FleetFacts(0, (1.0,), inner_steps=10))
    s.start(OrderedDict(w=torch.tensor([0.0])), num_workers=1)
    out = s.on_update(_u(1.0, 40, 50), OrderedDict(w=torch.tensor([0.0])))
    assert float(out["w"]) == pytest.approx(-1.0)  # plain DN: g as it came, never dropped


def test_no_job_computes_for_less_than_its_own_round_trip():
    """Worker 1 is fast (0.1 s/step) but far (3 s of transfers): DyLU gives it one step,
    dylu-rtt the 30 that cover its round trip; the others keep DyLU's sizes."""
    times, trips = [0.1, 0.1, 1.0], [0.2, 3.0, 0.2]
    sizes = {}
    for cls in (DyLU, DyLURtt):
        p = cls()
        p.start(steps=5, step_times=times, transfer_times=trips)
        sizes[cls.name] = [p.local_steps(w) for w in range(3)]
    assert sizes == {"dylu": [5, 1, 1], "dylu-rtt": [5, 30, 1]}


def test_a_far_dn_run_trains_replays_and_resumes_bit_for_bit(tmp_path):
    trains_replays_and_resumes(tmp_path, "strategy=far_workers:FarDN", "local_steps=dylu-rtt",
                               "profile=geo")
