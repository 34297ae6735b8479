"""Shared fixtures: a tiny, fast config and a private data cache per session."""

from __future__ import annotations

import os
import signal

import pytest

from fedlm import config_load
from fedlm.config import Config
from tests import fuzzing


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    # Tests share one tokenized-corpus cache, kept out of the user's ~/.cache.
    os.environ.setdefault("FEDLM_CACHE", str(tmp_path_factory.mktemp("fedlm-cache")))
    yield


# The files that take longest (`--durations`, 2 cores), longest first. `make test`
# runs them first (`-p xdist --dist loadfile --no-loadscope-reorder`): two workers
# given the long files first finish together, instead of one of them starting the
# 2-minute SuperNode-kill test when everything else is done. A file not listed
# keeps its place after these; a wrong order only costs time.
LONGEST_FIRST = ("test_flower_e2e.py", "test_deploy_kill.py", "test_bench_smoke.py",
                 "test_sweep.py", "test_resume.py", "test_deploy.py", "test_failures.py",
                 "test_stop_signal.py", "test_deploy_warm.py", "test_deploy_owner.py",
                 "test_ownership.py",
                 "test_track.py", "test_contract.py", "test_replay.py", "test_flwr_run.py",
                 "test_imports.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable


def pytest_configure(config):
    fuzzing.draw_seed()  # before xdist's workers start: they share it through the environment
    # A suite stopped with SIGTERM (CI's timeout, `kill`) unwinds like Ctrl-C, so the
    # fixtures' finalizers stop the SuperLinks, SuperNodes and servers they started.
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, interrupt)


def pytest_terminal_summary(terminalreporter):
    """The fuzz suites' random round, reproducible from this line (also with -q)."""
    terminalreporter.write_line(f"fuzz suites' random round: {fuzzing.SEED_VARIABLE}="
                                f"{os.environ.get(fuzzing.SEED_VARIABLE)} reproduces it")


def tiny_config(*overrides: str) -> Config:
    """A run small enough for a unit test: tiny model, few short jobs."""
    return config_load.load(None, ["model=tiny", "workers=3", "updates=4", "inner.steps=3",
                                   "inner.batch_size=4", "eval.every=2", "eval.batches=2",
                                   "eval.batch_size=8", "data.seq_len=64", *overrides])
