"""sim.batched: jobs in flight together train as one computation over stacked replicas
(fedlm.worker.batched). A replica computes the same bits alone as in any group; a
batched run equals the per-job run within the stated tolerance, replays and resumes
bit for bit; sim.batched = off is the per-job path."""

import sqlite3

import pytest
import torch

from fedlm import checkpoint, start
from fedlm.config_load import ConfigError
from fedlm.engine import Interrupted
from fedlm.inprocess import InProcessTransport
from fedlm.job import JobSpec
from fedlm.params import params_hash
from fedlm.replay import replay
from fedlm.runner import execute, run_inprocess
from fedlm.store import event_details
from fedlm.worker import batched, batching
from fedlm.worker.train import run_job
from tests.conftest import tiny_config

SYNC = ("strategy=diloco",)
DN_DYLU = ("strategy=delayed-nesterov", "local_steps=dylu", "fleet.preset=very", "updates=8")


def _same(a, b) -> bool:
    """Two trained jobs, to the bit: outer gradient, loss, new AdamW state."""
    return (params_hash(a.result.outer_grad) == params_hash(b.result.outer_grad)
            and a.result.train_loss == b.result.train_loss and a.opt_state.keys() == b.opt_state.keys()
            and all(torch.equal(torch.as_tensor(a.opt_state[k]), torch.as_tensor(b.opt_state[k]))
                    for k in a.opt_state))


def _jobs_and_states(cfg):
    """Five jobs of different H (one of none), two of them going on from a saved state
    (so their AdamW step counts and schedule positions differ from the others')."""
    theta = start.initial(cfg)
    first = run_job(theta, {}, JobSpec(0, 0, 0, 4, 7), cfg)
    second = run_job(theta, {}, JobSpec(1, 1, 0, 2, 8), cfg)
    jobs = [JobSpec(2, 0, 0, 3, 11, prev_job=0), JobSpec(3, 1, 0, 5, 12, prev_job=1),
            JobSpec(4, 2, 0, 2, 13), JobSpec(5, 3, 0, 5, 14), JobSpec(6, 4, 0, 0, 15)]
    states = [first.opt_state, second.opt_state, {}, {}, {}]
    return [(theta, st, job) for st, job in zip(states, jobs)]


@pytest.mark.parametrize("sets", [(), ("inner.grad_clip=0.05",), ("inner.precision=bf16",)],
                         ids=["fp32", "clipping", "bf16"])
def test_a_replica_computes_the_same_bits_alone_as_in_any_group(sets):
    # Also: a replica whose job is done is never touched by the longer jobs' steps,
    # else the 2-step jobs would differ between the group and alone.
    _alone_as_in_any_group(tiny_config("workers=5", *sets))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_on_a_gpu_a_replica_computes_the_same_bits_alone_as_in_any_group(precision):
    # cuBLAS may pick its batched kernels by the batch's size: what replay of a batched
    # GPU run rests on, checked where it runs
    _alone_as_in_any_group(tiny_config("workers=5", "device=cuda",
                                       f"inner.precision={precision}"))


def _alone_as_in_any_group(cfg) -> None:
    items = _jobs_and_states(cfg)
    together = batched.run_group(items, cfg)
    backwards = batched.run_group(items[::-1], cfg)[::-1]
    for item, one, other in zip(items, together, backwards):
        alone = batched.run_group([item], cfg)[0]
        assert _same(one, alone) and _same(one, other), item[2]
    assert together[4].opt_state == {"schedule_step": 0}  # no step: no AdamW state, as torch


def test_stacked_adamw_and_clipping_are_torch_s_to_the_bit():
    # Each replica with its own learning rates and step count (replica 1 goes on from
    # 3 earlier steps), the shorter job stopping after 2 steps: every row as torch's
    # AdamW and clip_grad_norm_ leave its own tensors. (The batched path's distance
    # from the per-job loop is all in its forward and backward.)
    from fedlm.config import InnerConfig
    from fedlm.worker.stacked_adamw import StackedAdamW, clip_grad_norms

    cfg, gen = InnerConfig(), torch.Generator().manual_seed(0)
    shapes, steps = [(6, 4), (4,)], [4, 4, 2]
    start = [torch.randn(3, *s, generator=gen) for s in shapes]
    grads = [[torch.randn(3, *s, generator=gen) for s in shapes] for _ in range(4)]
    lrs = [[1e-2 * (k + 1) / (s + 1) for s in range(h)] for k, h in enumerate(steps)]
    ours = {str(i): t.clone() for i, t in enumerate(start)}
    opt = StackedAdamW(ours, cfg, [0, 3, 0], lrs)
    theirs = [[t[k].clone().requires_grad_() for t in start] for k in range(3)]
    torch_opts = [torch.optim.AdamW(ps, betas=(cfg.beta1, cfg.beta2),
                                    weight_decay=cfg.weight_decay) for ps in theirs]
    for p in theirs[1]:  # 3 steps already taken, moments zero: as StackedAdamW starts it
        torch_opts[1].state[p] = {"step": torch.tensor(3.0), "exp_avg": torch.zeros_like(p),
                                  "exp_avg_sq": torch.zeros_like(p)}
    for s in range(4):
        active = sum(1 for h in steps if h > s)
        rows = {n: t[:active].detach().requires_grad_() for n, t in ours.items()}
        for i, row in enumerate(rows.values()):
            row.grad = grads[s][i][:active].clone()
        clip_grad_norms(rows, 0.5)
        opt.step(rows, active)
        for k in range(active):
            for p, g in zip(theirs[k], grads[s]):
                p.grad = g[k].clone()
            torch.nn.utils.clip_grad_norm_(theirs[k], 0.5)
            torch_opts[k].param_groups[0]["lr"] = lrs[k][s]
            torch_opts[k].step()
    for k in range(3):
        assert all(torch.equal(ours[str(i)][k], p.detach()) for i, p in enumerate(theirs[k]))
        assert all(torch.equal(opt.state_of(k, str(i))["exp_avg_sq"],
                               torch_opts[k].state[p]["exp_avg_sq"])
                   for i, p in enumerate(theirs[k]))


def _relative(a, b, scale) -> float:
    """‖a − b‖₂ / ‖scale‖₂ over all tensors of the dicts (float64)."""
    def norm(d):
        return sum((v.double() ** 2).sum() for v in d.values()).sqrt().item()
    return norm({k: a[k].double() - b[k].double() for k in a}) / norm(scale)


@pytest.mark.parametrize("precision,tolerance,loss_tolerance", [
    ("fp32", batched.TOLERANCE, 1e-5), ("bf16", batched.BF16_TOLERANCE, 1e-2)])
def test_a_group_equals_the_per_job_loop_within_the_tolerance(precision, tolerance,
                                                               loss_tolerance):
    cfg = tiny_config("workers=5", "inner.grad_clip=0.05",  # clipping on at every step
                      f"inner.precision={precision}")
    items = _jobs_and_states(cfg)
    for (theta, state, job), got in zip(items, batched.run_group(items, cfg)):
        want = run_job(theta, state, job, cfg)
        assert got.opt_state["schedule_step"] == want.opt_state["schedule_step"]
        assert abs(got.result.train_loss - want.result.train_loss) <= loss_tolerance
        if job.local_steps:
            g, w = got.result.outer_grad, want.result.outer_grad
            assert _relative(g, w, w) <= tolerance
            assert 0 < _relative(g, w, w)  # not the per-job loop's bits: another computation


class _Recording(InProcessTransport):
    """The in-process transport, keeping every outer gradient it hands back."""

    def collect(self, timeout):
        replies = super().collect(timeout)
        self.grads.update({r.job_id: r.outer_grad for r in replies if r.error is None})
        return replies


def _run(cfg, db):
    """Run ``cfg``; its final weights and each job's outer gradient."""
    seen = {}

    def connect(run_key):
        seen["t"] = _Recording(cfg, run_key=run_key)
        seen["t"].grads = {}
        return seen["t"], {w: "in-process" for w in range(cfg.workers)}

    run_id = execute(cfg, str(db), connect)
    return checkpoint.read(checkpoint.weights_for(db, run_id))["params"], seen["t"].grads


@pytest.mark.parametrize("arm", [SYNC, DN_DYLU], ids=["sync-diloco", "dn-dylu"])
def test_a_batched_run_equals_the_per_job_run_within_the_tolerance(tmp_path, arm):
    cfg = tiny_config(*arm)
    per_job, per_job_grads = _run(cfg, tmp_path / "off.db")
    both, both_grads = _run(tiny_config(*arm, "sim.batched=on"), tmp_path / "on.db")
    assert per_job_grads.keys() == both_grads.keys()  # the same jobs (the virtual clock)
    if arm == DN_DYLU:  # DyLU gave the jobs of a group different H
        with sqlite3.connect(tmp_path / "on.db") as conn:
            assert len({h for (h,) in conn.execute("SELECT local_steps FROM updates")}) > 1
    for j, want in per_job_grads.items():
        assert _relative(both_grads[j], want, want) <= batched.TOLERANCE, j
    moved = {k: per_job[k] - v for k, v in start.initial(cfg).items()}  # how far training went
    assert 0 < _relative(both, per_job, moved) <= batched.TOLERANCE


def _hash(db) -> str:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT final_hash FROM runs").fetchone()[0]


def test_a_batched_run_replays_bit_for_bit_and_records_its_mode(tmp_path):
    db = tmp_path / "on.db"
    run_id = run_inprocess(tiny_config(*DN_DYLU, "sim.batched=on"), str(db))
    assert event_details(db, run_id, batching.KIND) == ["on"]
    result = replay(db, run_id)
    assert result.identical and result.mismatched_updates == 0
    with sqlite3.connect(db) as conn:  # the log without its mode: replayed per job
        conn.execute("DELETE FROM events WHERE kind = ?", (batching.KIND,))
    assert not replay(db, run_id).identical


def test_a_batched_run_resumes_bit_for_bit(tmp_path):
    # disk states (checkpoints on): what a killed run needs; a resumed run re-sends
    # its jobs in flight, so they train in other groups than the first time
    sets = (*DN_DYLU, "updates=10", "reliability.checkpoint_every=2", "sim.batched=on")
    run_inprocess(tiny_config(*sets), str(tmp_path / "ref.db"))
    db, stop = tmp_path / "stopped.db", []
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*sets), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= 5 else None)
    run_inprocess(tiny_config(*sets), str(db), resume=1)
    assert _hash(db) == _hash(tmp_path / "ref.db")
    assert event_details(db, 1, batching.KIND) == ["on"]  # recorded once, kept on resume
    assert replay(db, 1).identical


def test_off_is_the_per_job_path(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("sim.batched = off trained a job batched")

    monkeypatch.setattr(batched, "job_updates", never)
    run_id = run_inprocess(tiny_config(*SYNC, "updates=2"), str(tmp_path / "off.db"))
    assert event_details(tmp_path / "off.db", run_id, batching.KIND) == ["off"]


def test_jobs_the_batched_path_does_not_take_run_on_their_own(tmp_path, monkeypatch):
    # injected faults act before or after training (their updates are never applied),
    # and a streaming job mixes fragments in mid-job: those run per job, the rest batched
    import fedlm.inprocess as inprocess

    alone, serve = [], inprocess.serve_job
    monkeypatch.setattr(inprocess, "serve_job",
                        lambda params, states, job, cfg, **kw: alone.append(job) or serve(
                            params, states, job, cfg, **kw))
    run_inprocess(tiny_config("strategy=async-sgd", "faults.crash=0.3", "faults.nan=0.2",
                              "faults.duplicate=0.2", "updates=6", "sim.batched=on"),
                  str(tmp_path / "faults.db"))
    assert alone and {job.fault for job in alone} <= {"crash", "hang", "nan"}
    alone.clear()
    run_inprocess(tiny_config("stream.fragments=2", "updates=2", "sim.batched=on"),
                  str(tmp_path / "stream.db"))
    assert alone and all(job.fragment >= 0 for job in alone)


def test_job_threads_run_groups_to_the_same_weights(tmp_path):
    sets = (*DN_DYLU, "sim.batched=on")
    run_inprocess(tiny_config(*sets), str(tmp_path / "one.db"))
    run_inprocess(tiny_config(*sets, "sim.job_threads=2"), str(tmp_path / "two.db"))
    assert _hash(tmp_path / "one.db") == _hash(tmp_path / "two.db")


def test_groups_are_by_shape_and_capped():
    class Item:
        def __init__(self, job_id):
            self.job = JobSpec(job_id, job_id, 0, 3, job_id)

    cap = batching.MAX_REPLICAS
    items = [Item(j) for j in range(2 * cap + 3)][::-1]  # cap + 2 even ids, cap + 1 odd
    out = batching.groups(items, key=lambda job: job.job_id % 2)
    assert sorted(len(g) for g in out) == [1, 2, cap, cap]
    for group in out:
        ids = [item.job.job_id for item in group]
        assert ids == sorted(ids) and len({i % 2 for i in ids}) == 1
    assert batching.split(list(range(5)), 2) == [[0, 1, 2], [3, 4]]  # one per job thread
    assert batching.split(list(range(3)), 8) == [[0], [1], [2]]


def test_auto_batches_where_measured_faster():
    assert batching.resolve(tiny_config("sim.batched=auto"))  # tiny, 64 tokens, the CPU
    for sets in (["model=small"], ["data.seq_len=128"], ["inner.compile=true"],
                 ["stream.fragments=2"], ["clock=wall", "fleet.emulate_speed=true"]):
        assert not batching.resolve(tiny_config("sim.batched=auto", *sets)), sets
    assert not batching.resolve(tiny_config())  # the default: off


def test_auto_batches_small_models_on_a_gpu(monkeypatch):
    monkeypatch.setattr("fedlm.model.resolve_device", lambda choice: "cuda")
    for model in ("tiny", "small", "20m"):
        assert batching.resolve(tiny_config("sim.batched=auto", f"model={model}",
                                            "data.seq_len=128")), model
    for sets in (["model=60m"], ["model=150m"], ["model=20m", "inner.compile=true"]):
        assert not batching.resolve(tiny_config("sim.batched=auto", *sets)), sets


@pytest.mark.parametrize("sets,match", [
    (["sim.batched=yes"], r"sim\.batched: must be auto, on or off"),
    (["sim.batched=on", "inner.compile=true"], r"sim\.batched: trains without torch\.compile"),
    (["sim.batched=on", "clock=wall", "fleet.emulate_speed=true"], r"sim\.batched: cannot pad"),
])
def test_bad_settings_are_refused_in_one_line(sets, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(*sets)
