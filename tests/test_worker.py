import pytest
import torch

from fedlm import data, model as M
from fedlm.config import InnerConfig
from fedlm.params import params_hash
from fedlm.model import load_into, snapshot
from fedlm.job import JobSpec
from fedlm.shards import data_shards
from fedlm.worker.train import inner_lr, run_job
from tests.conftest import tiny_config


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = InnerConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [inner_lr(s, cfg, decay_steps=110) for s in range(130)]
    assert lrs[0] == 0.1 and lrs[9] == 1.0
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert abs(lrs[60] - 0.55) < 1e-9  # halfway down the cosine
    assert lrs[110] == lrs[129] == 0.1


def test_job_returns_the_outer_gradient_and_carries_optimizer_state():
    cfg = tiny_config("inner.warmup_steps=0", "inner.lr=1e-2")
    theta = snapshot(M.build(cfg.model, cfg.data.seq_len, seed=0))
    job = JobSpec(job_id=0, worker=1, base_version=0, local_steps=3, data_seed=7)
    r1 = run_job(theta, {}, job, cfg)
    assert r1.result.steps == 3 and r1.result.tokens == 3 * cfg.inner.batch_size * cfg.data.seq_len
    assert r1.opt_state["schedule_step"] == 3
    # Sign convention g = θ_start − θ_end: θ − g is the worker's end model, which
    # fits the job's own batches better than θ does.
    corpus = data.load_corpus(cfg.data)
    shard = data_shards(cfg.data, cfg.shard_count(), cfg.seed)[1]
    seqs = torch.from_numpy(corpus.train[data.job_batches(shard, 3, 4, 7).ravel()].astype("int64"))
    net = M.build(cfg.model, cfg.data.seq_len, seed=0)

    def loss_of(p):
        load_into(net, p)
        with torch.no_grad():
            return net(seqs[:, :-1], seqs[:, 1:])[1].item()

    end = {n: theta[n] - r1.result.outer_grad[n] for n in theta}
    assert loss_of(end) < loss_of(theta) - 0.01
    r2 = run_job(theta, r1.opt_state, JobSpec(1, 1, 0, 3, 8), cfg)
    assert r2.opt_state["schedule_step"] == 6


def test_job_is_a_pure_function_of_params_state_and_job():
    cfg = tiny_config()
    theta = snapshot(M.build(cfg.model, cfg.data.seq_len, seed=0))
    job = JobSpec(job_id=0, worker=0, base_version=0, local_steps=3, data_seed=11)
    a = run_job(theta, {}, job, cfg)
    b = run_job(theta, {}, job, cfg)
    assert params_hash(a.result.outer_grad) == params_hash(b.result.outer_grad)
    c = run_job(theta, {}, JobSpec(0, 0, 0, 3, 12), cfg)
    assert params_hash(a.result.outer_grad) != params_hash(c.result.outer_grad)


class _NoStates:
    """A worker state store that keeps nothing (serve_job's contract only)."""

    def load(self, job_id):
        return {}

    def save(self, job_id, state):
        pass

    def prune(self, keep_from):
        pass


def test_speed_emulation_pads_a_job_to_its_workers_share_of_the_fastest(monkeypatch):
    # fleet.emulate_speed on the wall clock: a worker configured k times slower than the
    # fastest reports and really takes k times its measured compute; the fastest
    # worker is not padded, and the virtual clock never is.
    import time
    from dataclasses import replace

    from fedlm.job import JobResult
    from fedlm.worker import train

    measured = 0.05
    monkeypatch.setattr(train, "job_update", lambda params, state, job, cfg, state_on_device,
                        server_device, device=None:
                        train.Trained(JobResult(job.job_id, {}, compute_seconds=measured), {}))
    cfg = tiny_config("workers=2", "clock=wall", "fleet.step_times=[1.0, 4.0]",
                      "fleet.emulate_speed=true")

    def serve(worker, cfg):
        t0 = time.perf_counter()
        result = train.serve_job({}, _NoStates(), JobSpec(0, worker, 0, 1, 0), cfg)
        return result.compute_seconds, time.perf_counter() - t0

    reported, took = serve(1, cfg)
    assert reported == pytest.approx(4 * measured)
    assert took >= 3 * measured  # it slept for the padding, on top of the (mocked) job
    assert serve(0, cfg)[0] == pytest.approx(measured)
    assert serve(1, replace(cfg, clock="virtual"))[0] == pytest.approx(measured)
    # a deployed node told its own step time pads by that instead of the profile's
    told = train.serve_job({}, _NoStates(), JobSpec(0, 0, 0, 1, 0), cfg, step_time=2.0)
    assert told.compute_seconds == pytest.approx(2 * measured)
