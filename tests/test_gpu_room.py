"""Runs packed on one GPU (``fedlm sweep --jobs N`` where runs train on CUDA): refused in
one line, before any run starts, when N of the largest would not fit in its free memory.
No GPU is needed: the free memory is the test's."""

import pytest
import torch

from fedlm.errors import ConfigError
from fedlm.sim import memory
from fedlm.sweep.run import check_gpu_room
from tests.conftest import tiny_config

GIB = 1 << 30


def _spec(model: str) -> dict:
    return {"db": "s.db", "out": "s.md", "profiles": ["very"],
            "arm": [{"label": "a", "reference": True,
                     "set": ["strategy=diloco", f"model={model}", "device=cuda"]}]}


def test_a_run_needs_more_gpu_memory_with_a_larger_model_and_more_job_threads():
    tiny = memory.gpu_bytes(tiny_config())
    assert memory.gpu_bytes(tiny_config("model=small")) > tiny
    assert memory.gpu_bytes(tiny_config("sim.job_threads=4")) > tiny


def test_runs_that_fit_pass_and_too_many_are_refused_with_how_many_fit():
    cfg = tiny_config()
    need = memory.gpu_bytes(cfg)
    memory.check_gpu_jobs([cfg], 2, free=3 * need)
    with pytest.raises(ConfigError) as err:
        memory.check_gpu_jobs([cfg], 8, free=3 * need)
    line = str(err.value)
    assert "\n" not in line and "--jobs 8" in line and line.endswith("--jobs 2")
    with pytest.raises(ConfigError, match=r"--jobs 1 \(one at a time\)"):
        memory.check_gpu_jobs([cfg], 2, free=need)


def test_the_sweep_asks_the_gpu_its_free_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (2 * GIB, 80 * GIB))
    check_gpu_room(_spec("tiny"), 2)  # two tiny runs fit in 2 GiB
    with pytest.raises(ConfigError, match="GPU has free"):
        check_gpu_room(_spec("150m"), 64)


def test_runs_on_the_cpu_are_not_checked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_gpu_room(_spec("150m"), 64)
