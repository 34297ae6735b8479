"""Every registered strategy (and the documented plug-in examples) through the same checks;
the examples in docs/strategies.md are their files and run end to end as written."""

import os
import re
import sqlite3
import subprocess
import sys
from collections import OrderedDict
from contextlib import closing
from pathlib import Path

import pytest
import torch

from fedlm import servers
from fedlm.job import JobSpec
from fedlm.params import params_hash
from fedlm.sim import fleet
from fedlm.strategies import registry
from tests.conftest import tiny_config
from tests.support import run_engine

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PLUGIN = "fedasync_example:FedAsync"
SYNC_PLUGIN = "trimmed_mean_example:TrimmedMean"
# the strategy plug-ins of examples/ (their own tests pin each rule)
EXAMPLE_STRATEGIES = ["decoupled_diloco:DecoupledMerge", "heloco:HeLoCo", "cgad:CGAD"]
NAMES = sorted(registry.STRATEGIES) + [PLUGIN, SYNC_PLUGIN, *EXAMPLE_STRATEGIES]


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


class Served:
    """Strategy ``name`` on the server kind its config gets (``fedlm.servers``), started,
    driven through the calls the engine makes (``ServerCalls``)."""

    def __init__(self, name: str, theta, workers: int = 3) -> None:
        cfg = tiny_config(f"workers={workers}", f"strategy={name}")
        self.kind = servers.build(cfg, registry.build_strategy(name, {}))
        self.out, self.queue = [], []  # new models' hashes; messages on their way
        self.calls = servers.ServerCalls(
            self.kind, on_version=lambda v: self.out.append(params_hash(v.params)),
            on_messages=self.queue.extend)
        self.calls.start(theta, self.calls.links(fleet.node_profiles(cfg)))

    def state_dict(self) -> dict:
        return {"server": self.calls.state_dict(), "queue": list(self.queue)}

    def load_state_dict(self, state: dict) -> None:
        self.calls.load_state_dict(state["server"])
        self.queue[:] = state["queue"]


def drive(served: Served, steps, start_at=0, workers=3):
    """Feed synthetic jobs the way the engine does, through the server's calls: dispatch
    free workers, then finish the oldest job, and deliver the messages between servers
    on their way; return the hashes of the new evaluated models."""
    calls, free, flight, first = served.calls, list(range(workers)), [], len(served.out)
    for k in range(start_at, start_at + steps):
        version, theta = calls.evaluated()
        for w in list(free):
            if calls.wants_job(w, version):
                flight.append(calls.dispatch(JobSpec(1000 * k + w, w, version, 3, 0)).job)
                free.remove(w)
        job = flight.pop(0)
        free.append(job.worker)
        g = torch.Generator().manual_seed(1000 + k)
        grad = OrderedDict((n, 0.01 * torch.randn(t.shape, generator=g))
                           for n, t in theta.items())
        calls.finished(job, grad, tokens=100, steps=3)
        arriving, served.queue[:] = list(served.queue), []
        for m in arriving:
            calls.arrived(m.key)
    return served.out[first:]


def params():
    g = torch.Generator().manual_seed(0)
    return OrderedDict(w=torch.randn(4, 4, generator=g), b=torch.randn(4, generator=g))


@pytest.mark.parametrize("name", NAMES)
def test_state_survives_a_save_load_round_trip(name, tmp_path):
    # through its server, messages between servers delivered: all of its state counts
    a = Served(name, params())
    drive(a, 6)  # two full rounds of 3 workers: a sync round boundary
    torch.save(a.state_dict(), tmp_path / "state.pt")
    b = Served(name, params())
    b.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    # Both continue from the same point with the same inputs: same models.
    ha, hb = drive(a, 9, start_at=100), drive(b, 9, start_at=100)
    assert ha == hb and len(ha) > 0


@pytest.mark.parametrize("name", NAMES)
def test_short_run_is_finite_and_deterministic(name, tmp_path):
    cfg = tiny_config(f"strategy={name}", "fleet.step_times=[1.0, 1.7, 3.1]", "updates=4")
    _, a, _ = run_engine(cfg, tmp_path / "a.db", evaluate=False)
    _, b, _ = run_engine(cfg, tmp_path / "b.db", evaluate=False)
    assert all(torch.isfinite(t).all() for t in a.values())
    assert params_hash(a) == params_hash(b)


def test_plugin_loads_by_dotted_path_and_refuses_unknown_settings():
    from fedlm.config_load import load
    from fedlm.errors import ConfigError

    cfg = load(None, [f"strategy={PLUGIN}", "outer.alpha=0.5"])
    assert registry.build_strategy(cfg.strategy, cfg.outer).alpha == 0.5
    with pytest.raises(ConfigError, match="outer.beta: not a setting"):
        load(None, [f"strategy={PLUGIN}", "outer.beta=1"])
    with pytest.raises(ConfigError, match="cannot import"):
        load(None, ["strategy=no_such_pkg.mod:X"])


# shown whole on the page; the server plug-ins there (noloco, overlap_dc) are described
# by their rule and tested in tests/test_server_plugins.py
PAGE_EXAMPLES = ("fedasync_example", "trimmed_mean_example")


def doc_examples() -> dict[str, str]:
    """module name -> the docs/strategies.md code block that is that example file."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "strategies.md").read_text(),
                        flags=re.S)
    return {f.stem: next((b for b in blocks if b == f.read_text()), None)
            for f in sorted(EXAMPLES.glob("*.py")) if f.stem in PAGE_EXAMPLES}


def test_docs_show_each_example_verbatim():
    examples = doc_examples()
    assert set(examples) == {"fedasync_example", "trimmed_mean_example"}
    for name, text in examples.items():
        assert text is not None, f"docs/strategies.md has no code block equal to {name}.py"
        assert len(text.splitlines()) < 80, name


def run_doc_example(tmp_path, module: str, cls: str, *sets: str) -> tuple[Path, int]:
    """Write the doc's code block to a module, run it as a ``module:Class`` plug-in with the
    in-process backend, tiny model; return the store and the run id."""
    (tmp_path / f"{module}.py").write_text(doc_examples()[module])
    db = tmp_path / "e.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    args = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", "inprocess",
            "--db", str(db)]
    for kv in ["model=tiny", "workers=3", "inner.steps=2", "inner.batch_size=2",
               "eval.every=2", "eval.batches=1", "eval.batch_size=4", "data.seq_len=64",
               "reliability.checkpoint_every=0", f"strategy={module}:{cls}", *sets]:
        args += ["--set", kv]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ((run_id, status, initial, final),) = rows(
        db, "SELECT id, status, initial_hash, final_hash FROM runs")
    assert status == "finished" and final and final != initial  # the model changed
    return db, run_id


def rows(db, sql: str, *args) -> list[tuple]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(sql, args).fetchall()


def test_doc_sync_example_runs_and_closes_rounds_with_a_lost_job(tmp_path):
    # Worker 2 always hangs: each of its jobs ends at the deadline (the third miss
    # retires it), and only on_job_lost returning params closes those rounds: a
    # strategy that forgot to would stall the run and fail it.
    db, run_id = run_doc_example(tmp_path, "trimmed_mean_example", "TrimmedMean",
                                 "updates=4", "faults.hang=1.0", "faults.workers=[2]")
    lost = rows(db, "SELECT reason FROM jobs WHERE run_id=? AND status='lost' ORDER BY job_id",
                run_id)
    assert lost == [("deadline",), ("deadline",), ("retired",)]
    assert rows(db, "SELECT COUNT(*) FROM events WHERE run_id=? AND kind='round_closed'",
                run_id) == [(3,)]
    assert rows(db, "SELECT updates FROM runs WHERE id=?", run_id) == [(4,)]


def test_doc_async_example_runs_as_a_chain(tmp_path):
    db, run_id = run_doc_example(tmp_path, "fedasync_example", "FedAsync", "updates=12",
                                 "fleet.preset=very", "outer.max_staleness=1")
    # Updates staler than max_staleness arrived (the chain drops them) and the run went on.
    assert rows(db, "SELECT COUNT(*) FROM updates WHERE run_id=? AND staleness > 1",
                run_id)[0][0] > 0


# The plug-in on Flower's simulation engine: tests/test_stop_signal.py's Flower run is
# FedAsync loaded by dotted path (one Flower run for both).
