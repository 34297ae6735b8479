"""Streaming DiLoCo (stream.fragments, stream.overlap, stream.mix): fragments, what each
round's job carries and when, the worker's mix-in, the per-fragment outer step, and
that one fragment without overlap is DiLoCo bit for bit."""

import json
import sqlite3
from collections import OrderedDict

import pytest
import torch

from fedlm.config_load import from_dict, from_json, load
from fedlm.errors import ConfigError
from fedlm.job import JobResult, JobSpec
from fedlm.params import num_bytes
from fedlm.runner import run_inprocess
from fedlm.strategies import fragments as F
from fedlm.worker.streaming import LOCAL, REF, WorkerStream
from tests.conftest import tiny_config
from tests.support import run_engine

NAMES = ["tok_emb.weight", "blocks.0.a", "blocks.0.b", "blocks.1.a", "blocks.2.a",
         "blocks.3.a", "ln_f.weight", "head.weight"]


def test_fragments_are_strided_blocks_with_the_outer_tensors_at_the_ends():
    assert F.assign(NAMES, 2) == [0, 0, 0, 1, 0, 1, 1, 1]
    assert F.fragment_names(NAMES, 4)[3] == ["blocks.3.a", "ln_f.weight", "head.weight"]
    assert F.assign(NAMES, 1) == [0] * len(NAMES)
    with pytest.raises(ValueError, match="at most the model's 4 blocks"):
        F.assign(NAMES, 5)
    # H = 30 over 4 fragments: offsets 0, 7, 15, 22; every H steps each fragment once
    assert [F.segment_steps(30, 4, r) for r in range(8)] == [7, 8, 7, 8] * 2
    assert F.changed_since(4, 5, 4) == [0] and F.changed_since(2, 5, 4) == [0, 2, 3]
    assert F.changed_since(0, 9, 4) == [0, 1, 2, 3]


def test_streaming_settings_are_checked_in_one_line():
    for sets, msg in [(["stream.fragments=3"], "at most the 2 blocks"),
                      (["stream.fragments=2", "stream.overlap=1"], "less than the 1 inner steps"),
                      (["stream.mix=0"], "stream.mix: must be in"),
                      (["stream.fragments=2", "network.server_up=1e6"], "shared server link"),
                      (["stream.fragments=2", "strategy=delayed-nesterov"],
                           "stream.fragments: streaming rounds need a synchronous")]:
        with pytest.raises(ConfigError, match=msg):
            tiny_config("inner.steps=3", *sets)


def test_the_old_spelling_outer_fragments_still_reads_as_the_stream_section():
    # configs, sweep specs and the config every stored run keeps were written with the
    # streaming keys in ``outer``; they load as ``[stream]`` (and replay through it)
    old = load(None, ["model=tiny", "outer.fragments=2", "outer.overlap=1", "outer.mix=0.5"])
    assert (old.stream.fragments, old.stream.overlap, old.stream.mix, old.outer) == (2, 1, 0.5, {})
    stored = json.loads(old.to_json())
    stored.pop("stream")
    stored["outer"] = {"fragments": 2, "overlap": 1, "mix": 0.5}  # an older fedlm's run
    assert from_json(json.dumps(stored)) == old
    with pytest.raises(ConfigError, match=r"^outer.fragments: the old name of stream.fragments"):
        from_dict({"outer": {"fragments": 2}, "stream": {"fragments": 2}})


def test_the_worker_mixes_at_step_tau_and_reports_its_fragment_against_the_global():
    """Two fragments (blocks 0 | 1), α = ½, τ = 1, three fake inner steps of −1 each."""
    cfg = load(None, ["model=tiny", "stream.fragments=2", "stream.overlap=1", "stream.mix=0.5"])
    names = ["blocks.0.w", "blocks.1.w"]
    state = {LOCAL + "blocks.0.w": torch.tensor([10.0]), LOCAL + "blocks.1.w": torch.tensor([20.0]),
             REF + "blocks.0.w": torch.tensor([12.0]), REF + "blocks.1.w": torch.tensor([21.0])}
    sent = OrderedDict([("blocks.0.w", torch.tensor([4.0]))])  # the new global fragment 0
    job = JobSpec(7, 0, 3, 3, 0, fragment=1, mix_step=1)
    stream = WorkerStream(job, state, sent, names, cfg, "cpu")
    net = torch.nn.ParameterDict({"w0": torch.nn.Parameter(stream.start["blocks.0.w"].clone()),
                                  "w1": torch.nn.Parameter(stream.start["blocks.1.w"].clone())})

    class Net(torch.nn.Module):  # parameters named as in the model
        def named_parameters(self, *a, **k):
            return iter([("blocks.0.w", net["w0"]), ("blocks.1.w", net["w1"])])

    hook = stream.mix_hook(Net())
    trace = []
    for s in range(3):
        hook(s)
        with torch.no_grad():
            net["w0"] -= 1.0
            net["w1"] -= 1.0
        trace.append((net["w0"].item(), net["w1"].item()))
    # step 0: 10 -> 9; at step 1 mix: ½·4 + ½·9 = 6.5, then -> 5.5; step 2 -> 4.5
    assert trace == [(9.0, 19.0), (5.5, 18.0), (4.5, 17.0)]
    end = {"blocks.0.w": net["w0"], "blocks.1.w": net["w1"]}
    grad = stream.outer_gradient(end)
    assert list(grad) == ["blocks.1.w"] and grad["blocks.1.w"].item() == 21.0 - 17.0
    kept = stream.kept(end, on_device=False)
    assert kept[REF + "blocks.0.w"].item() == 4.0 and kept[REF + "blocks.1.w"].item() == 21.0
    assert kept[LOCAL + "blocks.0.w"].item() == 4.5


def test_a_fragment_round_steps_only_its_fragment_with_its_own_momentum():
    # The streamed server gives each fragment a FedAvg of its own (fedlm.servers.streamed)
    from fedlm import servers
    from fedlm.sim import fleet
    from fedlm.strategies import registry

    params = OrderedDict((n, torch.zeros(1)) for n in NAMES)
    cfg = tiny_config("workers=1", "strategy=fedavg", "outer.lr=1.0", "outer.momentum=0.5",
                      "stream.fragments=2")
    s = servers.build(cfg, registry.build_strategy(cfg.strategy, cfg.outer))
    calls = servers.ServerCalls(s, on_version=lambda version: None)
    calls.start(params, fleet.node_profiles(cfg))

    def round_(fragment, value):
        assert s.version % 2 == fragment  # round v is fragment v mod P's
        grad = OrderedDict((n, torch.full((1,), value)) for n in s.groups[fragment])
        job = calls.dispatch(JobSpec(s.version, 0, s.version, 1, 0)).job
        calls.finished(job, grad, tokens=1, steps=1)
        return s.params

    p1 = round_(0, 1.0)  # fragment 0 moves by 1 (momentum 1), fragment 1 not at all
    assert [p1[n].item() for n in NAMES] == [-1, -1, -1, 0, -1, 0, 0, 0]
    p2 = round_(1, 2.0)  # fragment 1's own momentum starts at 0: a step of 2
    assert [p2[n].item() for n in NAMES] == [-1, -1, -1, -2, -1, -2, -2, -2]
    p3 = round_(0, 1.0)  # fragment 0's momentum: 0.5·1 + 1 = 1.5
    assert [p3[n].item() for n in s.groups[0]] == [-2.5] * 4
    assert "fragments" not in registry.build_strategy("fedavg", {}).__dict__  # it knows none


class FragmentTransport:
    """Replies at once: each tensor of the reported fragment filled with
    (worker + 1)·(version + 1)/10; records what every job carried."""

    def __init__(self) -> None:
        self.jobs: list[tuple] = []
        self.ready: list[JobResult] = []

    def submit(self, job, params) -> None:
        names = F.fragment_names(_model_names(), 2)[job.fragment]
        value = (job.worker + 1) * (job.base_version + 1) / 10
        self.jobs.append((job.base_version, job.worker, job.fragment, job.mix_step,
                          job.local_steps, list(params)))
        grad = OrderedDict((n, torch.full_like(_THETA[n], value)) for n in names)
        self.ready.append(JobResult(job.job_id, grad, job.local_steps, 100, train_loss=1.0))

    def collect(self, timeout: float) -> list[JobResult]:
        out, self.ready = self.ready, []
        return out


_THETA: dict = {}


def _model_names() -> list[str]:
    return list(_THETA)


def test_a_two_fragment_overlap_one_schedule_step_by_step(tmp_path):
    """P = 2, τ = 1, H = 4, FedAvg (lr 1): four rounds of 2 steps on two identical
    workers with slow links, then one flushing round (no step: fragment 0 brought
    in once more), every payload, version and time pinned by hand."""
    from fedlm import model as M
    from fedlm.model import snapshot

    latency, bw = 0.25, 2e5  # bytes/s: an exchange takes longer than the one overlapped step
    cfg = tiny_config("workers=2", "updates=2", "inner.steps=4", "strategy=fedavg",
                      "stream.fragments=2", "stream.overlap=1", "fleet.preset=homogeneous",
                      "fleet.jitter=0", "fleet.regions=['slow', 'slow']",
                      f"fleet.links.slow={{latency = {latency}, down_bw = {bw}, up_bw = {bw}}}")
    theta = snapshot(M.build(cfg.model, cfg.data.seq_len, seed=cfg.seed))
    _THETA.clear()
    _THETA.update(theta)
    groups = F.fragment_names(list(theta), 2)
    transport = FragmentTransport()
    engine, final, _ = run_engine(cfg, tmp_path / "s.db", transport, evaluate=False)

    names = list(theta)
    frag_bytes = [num_bytes(OrderedDict((n, theta[n]) for n in g)) for g in groups]
    expected_jobs, t, times = [], 0.0, []
    for v in range(5):
        sent = names if v == 0 else groups[(v - 1) % 2]
        flush = v == 4  # no step; the new fragment mixed in at once
        for w in (0, 1):
            expected_jobs.append((v, w, v % 2, -1 if v == 0 else 0 if flush else 1,
                                  0 if flush else 2, sent))
        exchange = 2 * latency + frag_bytes[(v - 1) % 2] / bw + frag_bytes[(v - 1) % 2] / bw
        if v == 0:  # the whole model down, exposed; then 2 steps of 1 s
            t += latency + num_bytes(theta) / bw + 2.0
        elif flush:  # nothing to hide it behind
            t += exchange
        else:  # last round's fragment up and the new one down, behind 1 s of compute
            t += 2.0 + max(0.0, exchange - 1.0)
        times.append(t)
    assert transport.jobs == expected_jobs
    with sqlite3.connect(tmp_path / "s.db") as conn:
        done = [r[0] for r in conn.execute(
            "SELECT MAX(t_done) FROM updates GROUP BY base_version ORDER BY base_version")]
        kinds = dict(conn.execute("SELECT kind, SUM(t_end - t_start) FROM intervals"
                                  " WHERE worker = 0 GROUP BY kind"))
    assert done == pytest.approx(times, abs=1e-9)
    assert kinds["hidden exchange"] == pytest.approx(3 * 1.0)  # 1 s hidden in rounds 1-3
    assert kinds["compute"] == pytest.approx(8.0)
    # global: each round moves its fragment by the mean of (w + 1)(v + 1)/10, w = 0, 1
    for p, rounds in ((0, (0, 2, 4)), (1, (1, 3))):  # equal tokens: the plain mean
        shift = sum((1 + 2) / 2 * (v + 1) / 10 for v in rounds)
        for n in groups[p]:
            assert torch.allclose(final[n], theta[n] - shift, atol=1e-6)
    assert engine.version == 5  # updates = 2 outer steps of 2 fragment rounds, one flush


def test_one_fragment_without_overlap_is_diloco_bit_for_bit(tmp_path):
    sets = ["workers=2", "updates=3", "fleet.preset=moderate"]
    plain = run_inprocess(tiny_config(*sets), str(tmp_path / "a.db"))
    streamed = run_inprocess(tiny_config(*sets, "stream.fragments=1"), str(tmp_path / "b.db"))
    hashes = [sqlite3.connect(tmp_path / d).execute("SELECT final_hash FROM runs").fetchone()[0]
              for d in ("a.db", "b.db")]
    assert hashes[0] == hashes[1] and plain is not None and streamed is not None


STREAMED = ["workers=3", "updates=4", "inner.steps=4", "stream.fragments=2", "stream.overlap=1",
            "stream.mix=0.5", "network.compression=int8", "fleet.preset=geo",
            "reliability.checkpoint_every=2", "eval.every=2"]


def test_a_streaming_run_replays_and_resumes_bit_for_bit(tmp_path):
    from fedlm import store
    from fedlm.engine import Interrupted
    from fedlm.replay import replay

    ref_db, db = tmp_path / "reference.db", tmp_path / "stopped.db"
    run_inprocess(tiny_config(*STREAMED), str(ref_db))
    (ref,) = store.list_runs(ref_db)
    result = replay(ref_db, ref["id"])
    assert result.identical and result.versions == 9  # 4 outer steps of 2 fragments, a flush
    stop = []  # asked to stop once version 5 exists, then resumed from its checkpoint
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*STREAMED), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(p.version) if p.version >= 5 else None)
    run_inprocess(tiny_config(*STREAMED), str(db), resume=1)
    (run,) = store.list_runs(db)
    assert (run["status"], run["final_hash"]) == ("finished", ref["final_hash"])
