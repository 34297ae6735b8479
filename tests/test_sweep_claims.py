"""Two sweeps on one store share the cells: each is trained once (fedlm.sweep.claims)."""

import json
import subprocess
import sys

from fedlm import store
from fedlm.sweep import claims
from tests._processes import run_at_once

SPEC = """
db = "{db}"
out = "{out}"
profiles = ["very"]
seeds = [0, 1]
base = ["model=tiny", "workers=2", "updates=2", "inner.steps=2", "inner.batch_size=2",
        "eval.batches=1", "eval.batch_size=2", "data.seq_len=32"]
[[arm]]
label = "sync"
reference = true
set = ["strategy=diloco"]
[[arm]]
label = "async"
set = ["strategy=async-sgd"]
"""


def test_a_claim_is_one_processs_and_a_dead_owners_claim_is_taken_over(tmp_path):
    db = tmp_path / "s.db"
    mine = claims.take(db, "cell @ very seed 0")
    assert mine is not None
    assert claims.take(db, "cell @ very seed 0") is None  # held by a live process (this one)
    assert claims.held_elsewhere(db, "cell @ very seed 0")
    mine.release()
    assert not claims.held_elsewhere(db, "cell @ very seed 0")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    path = claims._path(db, "other")
    path.write_text(json.dumps({"host": __import__("socket").gethostname(),
                                "pid": int(dead), "started": 0.0, "at": 0.0}))
    taken = claims.take(db, "other")  # its owner is gone: a claim of nobody's
    assert taken is not None
    taken.release()


def test_two_sweeps_at_once_on_one_store_train_each_cell_once(tmp_path):
    db, out = tmp_path / "s.db", tmp_path / "s.md"
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(db=db, out=out))
    cmd = [sys.executable, "-m", "fedlm", "sweep", str(spec), "--backend", "inprocess"]
    results = run_at_once([cmd, cmd], timeout=400, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    outs = [out for _, out, _ in results]
    assert [rc for rc, _, _ in results] == [0, 0], outs
    names = [r["name"] for r in store.list_runs(db)]
    assert len(names) == 4 == len(set(names)), names  # 2 arms x 2 seeds, each once
    assert sum("another sweep is training it" in o or "by another sweep" in o
               for o in outs) >= 1  # they met
    assert not claims.folder_of(db).exists()
