"""Shared fixtures: a tiny, fast config and a private data cache per session."""

from __future__ import annotations

import os
import signal

import pytest

from fedlm import config_load
from fedlm.config import Config


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    # Tests share one tokenized-corpus cache, kept out of the user's ~/.cache.
    os.environ.setdefault("FEDLM_CACHE", str(tmp_path_factory.mktemp("fedlm-cache")))
    yield


def pytest_configure(config):
    # A suite stopped with SIGTERM (CI's timeout, `kill`) unwinds like Ctrl-C, so the
    # fixtures' finalizers stop the SuperLinks, SuperNodes and servers they started.
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, interrupt)


def tiny_config(*overrides: str) -> Config:
    """A run small enough for a unit test: tiny model, few short jobs."""
    return config_load.load(None, ["model=tiny", "workers=3", "updates=4", "inner.steps=3",
                                   "inner.batch_size=4", "eval.every=2", "eval.batches=2",
                                   "eval.batch_size=8", "data.seq_len=64", *overrides])
