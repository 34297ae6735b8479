"""The paper sweep's --quick mode, end to end on the tiny model (in-process backend)."""

import sqlite3
import subprocess
import sys
from pathlib import Path

from fedlm.sweep import load_spec

ROOT = Path(__file__).resolve().parent.parent


def test_quick_paper_sweep_writes_tables_and_plots(tmp_path):
    out = tmp_path / "results" / "paper_quick.md"
    proc = subprocess.run(
        [sys.executable, "-m", "fedlm", "sweep", str(ROOT / "experiments/configs/paper.toml"),
         "--quick", "--backend", "inprocess", "--jobs", "2", "--db", str(tmp_path / "q.db"),
         "--out", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = out.read_text()
    assert "| strategy | homogeneous | very | paper: no / slight / moderate / very |" in text
    for arm in ("DiLoCo (sync)", "Async DiLoCo (async-nesterov)", "async + poly", "fedbuff",
                "delayed-nesterov", "delayed-nesterov + DyLU"):
        assert f"| {arm} |" in text
    assert "41.35 / 41.35 / 41.35 / 41.35" in text  # the paper's numbers beside ours
    for png in ("paper_quick_ppl_vs_time.png", "paper_quick_ppl_vs_updates.png"):
        assert (out.parent / png).stat().st_size > 10_000
    # a run trained beside others ends as the same run trained alone
    spec = load_spec(ROOT / "experiments/configs/paper.toml", quick=True)
    arm = next(a for a in spec["arm"] if a["label"] == "delayed-nesterov + DyLU")
    alone = tmp_path / "alone.db"
    cmd = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", "inprocess",
           "--db", str(alone)]
    for kv in [*spec["base"], "profile=very", *arm["set"]]:
        cmd += ["--set", kv]
    assert subprocess.run(cmd, capture_output=True, timeout=300).returncode == 0
    assert _final_hash(alone, "%") == _final_hash(tmp_path / "q.db",
                                                 "delayed-nesterov + DyLU @ very")
    # a second invocation reuses the finished runs instead of training again
    again = subprocess.run(
        [sys.executable, "-m", "fedlm", "sweep", str(ROOT / "experiments/configs/paper.toml"),
         "--quick", "--backend", "inprocess", "--db", str(tmp_path / "q.db"), "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("reusing run") == 12


def _final_hash(db: Path, name: str) -> str:
    with sqlite3.connect(db) as conn:
        (digest,), = conn.execute("SELECT final_hash FROM runs WHERE name LIKE ? "
                                  "AND status = 'finished'", (name,)).fetchall()
    assert digest
    return digest
