"""`local_steps = fill` and `strategy = diloco-fill`: synchronous rounds in which every
worker computes until the round's slowest whole job of H steps ends
(strategies/local_steps.py `Fill`, strategies/diloco_fill.py)."""

import sqlite3
from collections import defaultdict

import pytest
import torch

from fedlm.config_load import ConfigError
from fedlm.replay import replay
from fedlm.runner import run_inprocess
from fedlm.store import list_runs
from fedlm.store.readers import operation_log
from fedlm.strategies import registry
from fedlm.strategies import transforms as T
from fedlm.strategies.fedavg import FedAvg
from tests.conftest import tiny_config
from tests.support import scalar, scalar_update, value

# three workers 1x, 2x and 4x as slow as the fastest, H = 4, no jitter: the slowest
# worker's job of 4 steps takes 16 s plus its transfers
TOY = ("fleet.step_times=[1.0, 2.0, 4.0]", "fleet.jitter=0", "inner.steps=4")
STEP_TIMES = (1.0, 2.0, 4.0)


def _log(tmp_path, name, *overrides):
    db = tmp_path / f"{name}.db"
    return operation_log(db, run_inprocess(tiny_config(*overrides), str(db)))


def _rounds(log) -> dict[int, list]:
    """The jobs of each round (by the version they started from), done or not."""
    rounds = defaultdict(list)
    for job in log.jobs.values():
        rounds[job["base_version"]].append(job)
    return rounds


def _ends(log) -> dict[int, float]:
    return {u["job_id"]: u["t_done"] for u in log.updates}


def test_every_job_of_a_round_ends_at_the_rounds_end_within_one_step(tmp_path):
    log = _log(tmp_path, "fill", "strategy=diloco-fill", "updates=3", *TOY)
    ends = _ends(log)
    rounds = _rounds(log)
    assert sorted(rounds) == [0, 1, 2]
    for version, jobs in rounds.items():
        start = {j["t_dispatch"] for j in jobs}
        assert len(start) == 1  # a round is handed out at once, at the barrier
        steps = {j["worker"]: j["local_steps"] for j in jobs}
        # by hand: T = 4 steps x 4 s of the slowest (equal links: the same transfers
        # for all, so they cancel); worker w fits floor(16 / t_w) steps
        assert steps == {0: 16, 1: 8, 2: 4}
        finish = [ends[j["job_id"]] for j in jobs]
        round_end = max(finish)
        slowest = next(j for j in jobs if j["worker"] == 2)
        assert ends[slowest["job_id"]] == round_end  # the slowest's H steps: sync's round
        for j in jobs:  # each ends at the round's end, or up to one of its steps before
            assert round_end - STEP_TIMES[j["worker"]] - 1e-9 <= ends[j["job_id"]] <= round_end
    # the same round as sync DiLoCo's (fixed H): the same length, no one idle in it
    sync = _log(tmp_path, "sync", "strategy=diloco", "updates=3", *TOY)
    assert log.run["virtual_time"] == pytest.approx(sync.run["virtual_time"])


def test_with_unequal_links_each_job_ends_within_one_step_of_the_round(tmp_path):
    # HALoS's measured links, 4 workers in 4 regions, compute scaled as in
    # experiments/archive/configs/halos.toml: the far worker (h3) spends ~20x its compute on
    # transfers, so the round is its round trip, and the near ones fill it
    db = tmp_path / "halos.db"
    cfg = tiny_config("strategy=diloco-fill", "updates=2", "fleet.preset=halos", "workers=4",
                      "fleet.base_step_time=0.0004", "fleet.jitter=0", "inner.steps=4")
    log = operation_log(db, run_inprocess(cfg, str(db)))
    step_time = {w: t for w, t in sqlite3.connect(db).execute(
        "SELECT worker, step_time FROM workers")}
    ends = _ends(log)
    for jobs in _rounds(log).values():
        round_end = max(ends[j["job_id"]] for j in jobs)
        steps = {j["worker"]: j["local_steps"] for j in jobs}
        assert steps[3] == 4 and min(steps[w] for w in (0, 1, 2)) > 4 * 6
        for j in jobs:
            end = ends[j["job_id"]]
            assert round_end - step_time[j["worker"]] - 1e-12 <= end <= round_end


def test_the_name_is_diloco_with_fill_bit_for_bit(tmp_path):
    named = _log(tmp_path, "named", "strategy=diloco-fill", "updates=2", *TOY)
    weighting = registry.build_strategy("diloco-fill", {}).weighting
    long = _log(tmp_path, "long", "strategy=diloco", "local_steps=fill",
                f"outer.weighting={weighting}", "updates=2", *TOY)
    assert (named.run["strategy"], named.run["local_steps"]) == ("diloco-fill", "fill")
    assert named.run["final_hash"] == long.run["final_hash"]


def test_a_worker_that_joins_mid_round_waits_unless_a_step_fits_and_a_leaver_is_not_waited_for(
        tmp_path):
    # worker 2 (4 s/step) joins at 6 s: the first round opened without it, 4 steps of
    # worker 1 = 8 s; 2 s left is less than one of its steps, so it waits for round 2.
    # It leaves for good at 20 s, mid round 2 (8-24 s): the round closes without it and
    # round 3 is sized over workers 0 and 1 again (8 s).
    log = _log(tmp_path, "churn", "strategy=diloco-fill", "updates=3",
               "fleet.join=[0, 0, 6]", "fleet.leave=[0, 0, 20]", *TOY)
    rounds = _rounds(log)
    by_worker = {v: {j["worker"]: j for j in jobs} for v, jobs in rounds.items()}
    assert set(by_worker[0]) == {0, 1}
    assert {w: j["local_steps"] for w, j in by_worker[0].items()} == {0: 8, 1: 4}
    assert set(by_worker[1]) == {0, 1, 2}
    assert {w: j["local_steps"] for w, j in by_worker[1].items()} == {0: 16, 1: 8, 2: 4}
    assert by_worker[1][2]["status"] == "lost" and by_worker[1][2]["reason"] == "departed"
    assert {w: j["local_steps"] for w, j in by_worker[2].items()} == {0: 8, 1: 4}
    ends = _ends(log)
    round2_end = max(ends[j["job_id"]] for j in rounds[1] if j["status"] == "done")
    assert round2_end == pytest.approx(by_worker[1][0]["t_dispatch"] + 16, abs=0.1)
    assert by_worker[2][0]["t_dispatch"] == pytest.approx(round2_end)


def test_a_late_worker_gets_the_time_left_in_the_round(tmp_path):
    # worker 0 joins at 3 s into a round of 16 s opened by workers 1 and 2 (8 and 16 s
    # of work): 13 s are left, 13 steps of 1 s (less its transfers: 12)
    log = _log(tmp_path, "late", "strategy=diloco-fill", "updates=1",
               "fleet.join=[3, 0, 0]", *TOY)
    first = {j["worker"]: j for j in _rounds(log)[0]}
    assert first[0]["t_dispatch"] == pytest.approx(3.0)
    assert first[0]["local_steps"] in (12, 13)
    ends = _ends(log)
    assert ends[first[0]["job_id"]] <= ends[first[2]["job_id"]] + 1e-9


def test_a_fill_run_replays_and_resumes_bit_for_bit(tmp_path):
    from fedlm.engine import Interrupted

    sets = ["strategy=diloco-fill", "fleet.preset=very", "updates=6",
            "fleet.join=[0, 0, 30]", "reliability.checkpoint_every=2"]
    ref_db, db = tmp_path / "reference.db", tmp_path / "stopped.db"
    run_inprocess(tiny_config(*sets), str(ref_db))
    (ref,) = list_runs(ref_db)
    assert replay(ref_db, ref["id"]).identical
    stop = []
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*sets), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= 3 else None)
    run_inprocess(tiny_config(*sets), str(db), resume=1)
    (run,) = list_runs(db)
    assert (run["status"], run["final_hash"]) == ("finished", ref["final_hash"])


def test_fednova_merge_by_hand():
    # outer gradients 2 (1 step) and 8 (4 steps): per step 2 and 2, mean 2, times the
    # mean of the steps (2.5): 5. Tokens would give (2 + 4 * 8) / 5 = 6.8, uniform 5.0.
    merged = T.normalized_mean([scalar(2.0), scalar(8.0)], [1, 4])
    assert value(merged) == pytest.approx(5.0)
    merged = T.normalized_mean([scalar(2.0), scalar(8.0), scalar(3.0)], [1, 4, 3])
    tau = (1 + 4 + 3) / 3
    assert value(merged) == pytest.approx(tau * (2 / 1 + 8 / 4 + 3 / 3) / 3)
    # equal steps: the uniform mean, to the bit
    same = T.normalized_mean([scalar(2.0), scalar(8.0)], [5, 5])
    assert torch.equal(same["w"], T.weighted_mean([scalar(2.0), scalar(8.0)], [1, 1])["w"])


def test_fednova_weighting_in_a_round():
    fedavg = FedAvg(weighting="fednova")  # lr 1, no momentum: θ − merged
    params = scalar(10.0)
    fedavg.start(params, num_workers=2)
    for w, (g, steps) in enumerate([(2.0, 1), (8.0, 4)]):
        fedavg.on_dispatch(w, version=0)
    first = scalar_update(0, 2.0)
    second = scalar_update(1, 8.0)
    second = type(second)(**{**second.__dict__, "local_steps": 4, "tokens": 4})
    assert fedavg.on_update(first, params) is None
    assert value(fedavg.on_update(second, params)) == pytest.approx(10.0 - 5.0)


def test_refusals_are_one_line():
    with pytest.raises(ConfigError, match=r"^local_steps: sizes synchronous rounds; "
                                          r"'delayed-nesterov' has none"):
        tiny_config("strategy=delayed-nesterov", "local_steps=fill")
    for policy, hint in [("fixed", "strategy=diloco"), ("dylu", "strategy=diloco-dylu")]:
        with pytest.raises(ConfigError) as err:
            tiny_config("strategy=diloco-fill", f"local_steps={policy}")
        assert hint in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^outer.weighting: must be tokens, uniform or "
                                          r"fednova"):
        tiny_config("strategy=diloco", "outer.weighting=steps")
    assert tiny_config("strategy=diloco-fill").local_steps == "fill"
