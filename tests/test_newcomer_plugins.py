"""The two plug-ins written from docs/strategies.md alone (examples/fedbuff_like.py,
examples/gossip_pairs.py): each rule pinned by hand on a two-number model, its
settings checked, its state round-tripped, and a tiny in-process run through
`fedlm run --backend inprocess` that trains, replays bit for bit and (gossip)
resumes bit for bit after a SIGKILL.

Run: PYTHONPATH=examples python -m pytest -q tests/test_newcomer_plugins.py
"""

import io
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedlm.strategies.base import Update

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))  # as PYTHONPATH=examples does for `fedlm run`

from fedbuff_like import FedBuffLike  # noqa: E402
from gossip_pairs import GossipPairs  # noqa: E402
TINY = ["model=tiny", "inner.steps=2", "eval.batches=1"]


def Upd(worker, job_id, base_version, outer_grad, staleness=0):  # noqa: N802
    """An `Update` with one token and one inner step."""
    return Update(worker=worker, job_id=job_id, base_version=base_version,
                  outer_grad=outer_grad, tokens=1, local_steps=1, staleness=staleness)


def tree(*values):
    return OrderedDict(w=torch.tensor(values, dtype=torch.float64))


def close(params, *expected):
    assert torch.allclose(params["w"], torch.tensor(expected, dtype=torch.float64),
                          rtol=0, atol=1e-12), params["w"]


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


# --- fedlm's CLI, in its own process --------------------------------------------------

def fedlm(*args, check=True):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "fedlm", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r


def run_args(db, strategy, sets):
    args = ["run", "--backend", "inprocess", "--quiet", "--db", str(db),
            "--set", f"strategy={strategy}"]
    for s in TINY + sets:
        args += ["--set", s]
    return args


def run(db, strategy, *sets):
    """One tiny run; returns (run id, its summary text)."""
    out = fedlm(*run_args(db, strategy, list(sets))).stdout
    return int(re.search(r"\(run (\d+)\)", out).group(1)), out


def summary_numbers(out):
    ppl = re.search(r"validation perplexity ([\d.]+|nan|inf) -> ([\d.]+|nan|inf)", out)
    upd = re.search(r"(\d+) updates from (\d+) jobs", out)
    return float(ppl.group(1)), float(ppl.group(2)), int(upd.group(1)), int(upd.group(2))


def replayed_hash(db, run_id):
    """`fedlm replay`: asserts the replay is identical and returns the final weights' hash."""
    out = fedlm("replay", str(run_id), "--db", str(db)).stdout
    rec = re.search(r"recorded final weights (\w+)", out).group(1)
    rep = re.search(r"replayed final weights (\w+)", out).group(1)
    assert rec == rep and "identical" in out, out
    return rec


def check_trained(out, updates, jobs=None):
    first, last, n_updates, n_jobs = summary_numbers(out)
    assert math.isfinite(first) and math.isfinite(last), out
    assert last < first, out  # the updates were applied and moved the model downhill
    assert n_updates == updates, out
    if jobs is not None:
        assert n_jobs == jobs, out


# --- FedBuff-like ---------------------------------------------------------------------

def test_fedbuff_like_rule_by_hand():
    s = FedBuffLike(lr=0.5, k=2)
    p = tree(1.0, 2.0)
    s.start(p, num_workers=3)
    assert s.on_update(Upd(0, 1, 0, tree(0.2, 0.4)), p) is None  # held: 1 of K = 2
    p = s.on_update(Upd(1, 2, 0, tree(0.6, -0.2), staleness=0), p)
    close(p, 1.0 - 0.5 * 0.4, 2.0 - 0.5 * 0.1)  # θ − η·mean(g1, g2)
    assert s.on_update(Upd(2, 3, 0, tree(1.0, 1.0), staleness=1), p) is None
    p = s.on_update(Upd(0, 4, 1, tree(3.0, 0.0), staleness=0), p)
    close(p, 0.8 - 0.5 * 2.0, 1.95 - 0.5 * 0.5)  # staleness plays no part
    assert s.applied == 2


def test_fedbuff_like_default_k_is_the_number_of_workers():
    s = FedBuffLike(lr=1.0)
    p = tree(0.0)
    s.start(p, num_workers=3)
    assert s.on_update(Upd(0, 1, 0, tree(3.0)), p) is None
    assert s.on_update(Upd(1, 2, 0, tree(6.0)), p) is None
    close(s.on_update(Upd(2, 3, 0, tree(0.0)), p), -3.0)


def test_fedbuff_like_state_resumes_mid_buffer():
    a, b = FedBuffLike(lr=0.3, k=3), FedBuffLike(lr=0.3, k=3)
    p = tree(1.0, -1.0)
    a.start(p, num_workers=2)
    a.on_update(Upd(0, 1, 0, tree(0.5, 0.5)), p)
    b.start(p, num_workers=2)
    b.load_state_dict(roundtrip(a.state_dict()))  # one gradient sits in the buffer
    for s in (a, b):
        assert s.on_update(Upd(1, 2, 0, tree(1.0, 0.0)), p) is None
    pa, pb = (s.on_update(Upd(0, 3, 0, tree(1.5, -0.5)), p) for s in (a, b))
    close(pa, 1.0 - 0.3 * 1.0, -1.0 - 0.3 * 0.0)
    assert torch.equal(pa["w"], pb["w"])


@pytest.mark.parametrize("kw", [{"k": -1}, {"k": 1.5}, {"lr": 0.0}, {"lr": -1.0}])
def test_fedbuff_like_refuses_bad_settings(kw):
    key = next(iter(kw))
    with pytest.raises(ValueError, match=f"outer.{key}:"):
        FedBuffLike(**kw)


def test_fedbuff_like_run_trains_replays_and_k_matters(tmp_path):
    db = tmp_path / "fedbuff.db"
    rid, out = run(db, "fedbuff_like:FedBuffLike", "workers=2", "updates=4", "outer.k=2")
    check_trained(out, updates=4, jobs=8)  # K = 2 arrivals per applied update
    h2 = replayed_hash(db, rid)
    rid, out = run(db, "fedbuff_like:FedBuffLike", "workers=2", "updates=4")
    check_trained(out, updates=4, jobs=8)  # the default K is the number of workers, 2
    assert replayed_hash(db, rid) == h2
    rid, out = run(db, "fedbuff_like:FedBuffLike", "workers=2", "updates=4", "outer.k=1")
    check_trained(out, updates=4, jobs=4)
    assert replayed_hash(db, rid) != h2


# --- gossip pairs ---------------------------------------------------------------------

def test_gossip_pairs_rule_by_hand():
    s = GossipPairs()  # weight ½
    p = tree(1.0, 1.0)
    s.start(p, num_workers=2)
    s.on_dispatch(0, version=0)
    s.on_dispatch(1, version=0)
    p = s.on_update(Upd(0, 1, 0, tree(0.2, 0.0)), p)
    close(p, 0.9, 1.0)  # ½·θ + ½·(θ − g) for a fresh update
    s.on_dispatch(0, version=1)  # starts from (0.9, 1.0)
    p = s.on_update(Upd(1, 2, 0, tree(0.0, 0.4), staleness=1), p)
    close(p, 0.95, 0.8)  # ½·(0.9, 1) + ½·((1, 1) − g): its own start, not θ − ½g = (0.9, 0.8)
    p = s.on_update(Upd(0, 3, 1, tree(0.1, 0.1), staleness=1), p)
    close(p, 0.875, 0.85)
    assert s.applied == 3


def test_gossip_pairs_weight_and_lost_jobs():
    s = GossipPairs(weight=0.25)
    p = tree(2.0)
    s.start(p, num_workers=3)
    for w in range(3):
        s.on_dispatch(w, version=0)
    assert s.on_job_lost(2, job_id=3, reason="error", params=p) is None
    p = s.on_update(Upd(0, 1, 0, tree(4.0)), p)
    close(p, 0.75 * 2.0 + 0.25 * (2.0 - 4.0))  # 1.0
    p = s.on_update(Upd(1, 2, 0, tree(2.0), staleness=1), p)
    close(p, 0.75 * 1.0 + 0.25 * (2.0 - 2.0))  # stale: (1 − w)·θ + w·(θ_base − g)
    assert s.state_dict()["starts"] == {}  # nothing kept for the lost job


def test_gossip_pairs_state_resumes_with_past_models():
    a, b = GossipPairs(), GossipPairs()
    p = tree(1.0, 1.0)
    a.start(p, num_workers=2)
    a.on_dispatch(0, version=0)
    a.on_dispatch(1, version=0)
    p = a.on_update(Upd(0, 1, 0, tree(0.2, 0.0)), p)
    a.on_dispatch(0, version=1)
    b.start(tree(1.0, 1.0), num_workers=2)
    b.load_state_dict(roundtrip(a.state_dict()))  # worker 1 still runs from version 0
    pa, pb = (s.on_update(Upd(1, 2, 0, tree(0.0, 0.4), staleness=1), p) for s in (a, b))
    close(pb, 0.95, 0.8)
    assert torch.equal(pa["w"], pb["w"])


@pytest.mark.parametrize("weight", [0.0, -0.5, 1.5])
def test_gossip_pairs_refuses_bad_weight(weight):
    with pytest.raises(ValueError, match="outer.weight:"):
        GossipPairs(weight=weight)


GOSSIP = ["workers=3", "updates=40", "eval.every=20", "reliability.checkpoint_every=2"]


def test_gossip_pairs_run_trains_replays_and_resumes(tmp_path):
    db = tmp_path / "gossip.db"
    rid, out = run(db, "gossip_pairs:GossipPairs", *GOSSIP)
    check_trained(out, updates=40, jobs=40)  # one applied update per arrival
    whole = replayed_hash(db, rid)

    rid, out = run(db, "gossip_pairs:GossipPairs", *GOSSIP, "outer.weight=1.0")
    check_trained(out, updates=40)
    assert replayed_hash(db, rid) != whole  # the weight reaches the model

    # Kill the same run (SIGKILL) once it has written a checkpoint, resume it, and
    # it must end on the uninterrupted run's weights.
    db2 = tmp_path / "killed.db"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "examples")]))
    proc = subprocess.Popen([sys.executable, "-m", "fedlm",
                             *run_args(db2, "gossip_pairs:GossipPairs", GOSSIP)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        if list((tmp_path / "checkpoints").glob("killed.db-*/ckpt-v*.pt")):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the run finished before it could be killed")
    assert proc.returncode == -signal.SIGKILL
    assert "crashed" in fedlm("runs", "--db", str(db2)).stdout
    out = fedlm("run", "--backend", "inprocess", "--quiet", "--resume", "1",
                "--db", str(db2)).stdout
    check_trained(out, updates=40, jobs=40)
    assert replayed_hash(db2, 1) == whole
