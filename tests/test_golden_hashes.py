"""Golden final-weight hashes: a short run of every server kind and round kind, pinned.

Each run below ends on the weights whose hash ``tests/golden_hashes.json`` keeps, and
replays to them. A refactor that changes no behaviour leaves every hash as it is; one
that changes behaviour on purpose regenerates the file, as torchft's tests do:

    FEDLM_REGENERATE_GOLDEN=1 python -m pytest tests/test_golden_hashes.py

and says why in its commit. The hashes are of float computations on CPU: another torch
version or platform may round differently (then regenerate, and check the reason).
"""

import json
import os
import sys
from pathlib import Path

import pytest

from fedlm import store
from fedlm.replay import replay
from fedlm.runner import run_inprocess
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOLDEN = Path(__file__).with_name("golden_hashes.json")
REGENERATE = os.environ.get("FEDLM_REGENERATE_GOLDEN") == "1"

# Every run: the tiny model, a few short jobs, one evaluation batch, no checkpoints.
SMALL = ("workers=3", "updates=4", "inner.steps=2", "eval.every=4", "eval.batches=1",
         "reliability.checkpoint_every=0")
SPEEDS = "fleet.step_times=[1.0, 1.7, 3.1]"
HANG_2 = ("faults.hang=1.0", "faults.workers=[2]")  # worker 2's every job misses its deadline

RUNS = {
    # one server, synchronous rounds
    "diloco": ("strategy=diloco", SPEEDS),
    "fedavg-crash": ("strategy=fedavg", "faults.crash=0.3", "updates=5"),
    "fedavg-sampled": ("strategy=fedavg", "workers=4", "outer.fraction=0.5",
                       "outer.overcommit=2", "fleet.step_times=[1.0, 1.3, 1.6, 2.0]",
                       "updates=5"),  # over-committed replies dropped
    "fedavg-sampled-lost": ("strategy=fedavg", "workers=4", "outer.fraction=0.5",
                            "outer.overcommit=1.5", "fleet.jitter=0.5",
                            "updates=6"),  # a closed round's job misses its deadline
    "diloco-sampled-late-next": ("strategy=diloco", "workers=4", "outer.fraction=0.5",
                                 "outer.overcommit=2", "outer.late=next",
                                 "outer.sample_by=data", "outer.weighting=fednova",
                                 "profile=very", "updates=5"),
    "diloco-fill": ("strategy=diloco-fill", "profile=very"),
    "diloco-dylu": ("strategy=diloco-dylu", "profile=very"),
    "deadline": ("strategy=diloco", *HANG_2, "reliability.deadline=30", "updates=5"),
    "min-replies": ("strategy=fedavg", *HANG_2, "outer.min_replies=3",
                    "updates=2"),  # rounds start over
    "churn": ("strategy=diloco-fill", "fleet.availability={up = 30, down = 10}",
              "updates=6"),
    "fedadam": ("strategy=fedopt:FedAdam", SPEEDS),
    # one server, asynchronous
    "delayed-nesterov-dylu": ("strategy=delayed-nesterov", "local_steps=dylu",
                              "profile=very", "updates=6"),
    "fedbuff": ("strategy=fedbuff", "outer.buffer_size=2", SPEEDS, "updates=4"),
    "async-sgd": ("strategy=async-sgd", SPEEDS, "updates=6"),
    # other server kinds
    "streaming": ("strategy=diloco", "workers=2", "inner.steps=4", "stream.fragments=2",
                  "stream.overlap=1"),
    "halos": ("strategy=halos", "workers=4", "fleet.topology={us = 2, eu = 2}",
              "updates=6", "outer.push_every=2", "outer.buffer_size=2"),
    # the plug-ins of examples/
    "trimmed-mean": ("strategy=trimmed_mean_example:TrimmedMean", "workers=4", *HANG_2),
    "desloc": ("strategy=desloc:DesLoc", "outer.group_periods=tok_emb.*=2,pos_emb.*=3",
               "faults.crash=0.3", "updates=5"),
    "semi-sync": ("strategy=semi_sync:SemiSyncFill", "profile=very", "workers=4",
                  "fleet.jitter=0.3", "updates=6", "outer.deadline_k=0"),
    "pipelined": ("server=pipelined:PipelinedServer", "strategy=delayed-nesterov",
                  "updates=6", "outer.buffer_size=2"),
    "overlapped": ("strategy=overlap_dc_example:OverlappedDiLoCo", "profile=geo",
                   "workers=4", "fleet.jitter=0.5"),  # replies arrive out of worker order
    "decoupled": ("strategy=decoupled_diloco:DecoupledMerge", "grace=adaptive",
                  "outer.quorum=2", SPEEDS, "updates=5"),
}


@pytest.fixture
def examples_on_path(monkeypatch):
    """examples/ on the path for one run; its modules forgotten after, so that no other
    test of the process finds a plug-in it did not import itself."""
    before = set(sys.modules)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    for name in set(sys.modules) - before:
        if str(EXAMPLES) in str(getattr(sys.modules[name], "__file__", "") or ""):
            del sys.modules[name]


def _golden() -> dict[str, str]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_ends_on_its_golden_hash_and_replays_to_it(name, tmp_path, examples_on_path):
    db = tmp_path / "run.db"
    run_id = run_inprocess(tiny_config(*SMALL, *RUNS[name]), str(db))
    (run,) = store.list_runs(db)
    assert run["status"] == "finished"
    if REGENERATE:
        GOLDEN.write_text(json.dumps({**_golden(), name: run["final_hash"]}, indent=1,
                                     sort_keys=True) + "\n")
    assert run["final_hash"] == _golden().get(name), (
        f"{name}: the final weights changed (FEDLM_REGENERATE_GOLDEN=1 if on purpose)")
    assert replay(db, run_id).identical


def test_every_golden_hash_has_its_run():
    if REGENERATE:
        GOLDEN.write_text(json.dumps({k: v for k, v in _golden().items() if k in RUNS},
                                     indent=1, sort_keys=True) + "\n")
    assert sorted(_golden()) == sorted(RUNS)
