"""Shared by the tests that drive the engine directly: one run built as
``fedlm.runner`` builds it (``open_run``, ``worker_rows``), over any transport; and
one-number models for strategies pinned step by step."""

from __future__ import annotations

from collections import OrderedDict

import torch

from fedlm import model as M
from fedlm.engine import assemble
from fedlm.evaluate import Evaluator
from fedlm.inprocess import InProcessTransport
from fedlm.model import snapshot
from fedlm.params import params_hash
from fedlm.runner import open_run, worker_rows
from fedlm.sim import fleet
from fedlm import servers
from fedlm.strategies.base import Update


def run_engine(cfg, db, transport=None, evaluate=True, server=None):
    """Run ``cfg`` to the end into the store at ``db``, with ``transport`` (default: the
    in-process trainer) and (``evaluate``) evaluations: (engine, final params, run id).
    ``server``: the run's server kind, built by the test (to look at its strategy)."""
    server = server if server is not None else servers.build(cfg)
    writer = open_run(cfg, db, servers.summary(server))
    profiles = fleet.node_profiles(cfg)
    writer.add_workers(worker_rows(cfg, profiles))
    engine = assemble(cfg, server=server, transport=transport or InProcessTransport(cfg),
                      fleet=profiles, writer=writer,
                      evaluate=Evaluator(cfg) if evaluate else None)
    net = M.build(cfg.model, cfg.data.seq_len, seed=cfg.seed)
    theta = snapshot(net)
    writer.set_model_info(M.num_parameters(net), params_hash(theta))
    final = engine.run(theta)
    writer.finish(status="finished", virtual_time=engine.now, updates=engine.version,
                  final_hash=params_hash(final))
    writer.close()
    return engine, final, writer.run_id


# One-number models, for strategies pinned step by step by hand.
def scalar(x: float) -> OrderedDict:
    """A model (or an outer gradient) of one float64 tensor holding ``x``."""
    return OrderedDict(w=torch.tensor([float(x)], dtype=torch.float64))


def value(tree) -> float:
    """The number in a ``scalar`` model."""
    return float(tree["w"][0])


def scalar_update(worker: int, g: float) -> Update:
    """Worker ``worker``'s finished job with outer gradient ``g``."""
    return Update(worker=worker, job_id=0, base_version=0, outer_grad=scalar(g), tokens=1,
                  local_steps=1, staleness=0)


def play_round(strategy, grads: dict[int, float], params):
    """One synchronous round at version 0: each worker of ``grads`` (worker -> its
    scalar outer gradient) dispatched, then reporting in that order; what the last
    report made (``on_update``'s answer)."""
    for w in grads:
        assert strategy.wants_job(w, version=0)
        strategy.on_dispatch(w, version=0)
    out = None
    for w, g in grads.items():
        out = strategy.on_update(scalar_update(w, g), params)
    return out


def trains_replays_and_resumes(tmp_path, *sets: str, stop_at: int = 2):
    """A short tiny run of ``sets`` (``tests.conftest.tiny_config``, a checkpoint every
    version): its perplexity falls, its replay ends on the same weights, and the run
    stopped once version ``stop_at`` exists, then resumed from that checkpoint, ends on the
    same weights too. Returns the reference run's store."""
    import sqlite3

    import pytest

    from fedlm import store
    from fedlm.engine import Interrupted
    from fedlm.replay import replay
    from fedlm.runner import run_inprocess
    from tests.conftest import tiny_config

    cfg = tiny_config(*sets, "reliability.checkpoint_every=1")
    ref = tmp_path / "reference.db"
    run_inprocess(cfg, str(ref))
    (run,) = store.list_runs(ref)
    s = store.summarize(ref, run["id"])
    assert run["status"] == "finished" and s.final_perplexity < s.first_perplexity
    assert replay(ref, run["id"]).identical
    cut, stop = tmp_path / "stopped.db", []
    with pytest.raises(Interrupted):
        run_inprocess(cfg, str(cut), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= stop_at else None)
    run_inprocess(cfg, str(cut), resume=1)
    (again,) = store.list_runs(cut)
    assert again["status"] == "finished" and again["final_hash"] == run["final_hash"]
    with sqlite3.connect(cut) as conn:
        (how,) = conn.execute("SELECT detail FROM events WHERE kind='resumed'").fetchone()
    assert how.startswith("from ") and "version" in how  # from a checkpoint, not the start
    return ref
