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
    assert "| arm | very | moderate | paper: very / moderate |" in text
    for arm in ("DiLoCo (sync)", "DN + DyLU, lr 0.7", "Async DiLoCo (naive), lr 0.35",
                "none: DiLoCo (sync)", "none: DN + DyLU, lr 0.175"):
        assert f"| {arm} |" in text
    assert "41.35 / 41.35" in text  # the paper's numbers beside ours
    # an ablation arm runs only where it says, and is compared with its own reference
    gaps = text.split("### Per-update gap")[1].split("###")[0]
    assert "| none: DiLoCo (sync) | +0.0% | – |" in gaps
    assert "| DiLoCo (sync) | +0.0% | +0.0% |" in gaps
    assert "as a fraction of the reference's own time" in text
    for png in ("paper_quick_ppl_vs_time.png", "paper_quick_ppl_vs_updates.png"):
        assert (out.parent / png).stat().st_size > 10_000
    # a run trained beside others ends as the same run trained alone
    spec = load_spec(ROOT / "experiments/configs/paper.toml", quick=True)
    arm = next(a for a in spec["arm"] if a["label"] == "DN + DyLU, lr 0.7")
    alone = tmp_path / "alone.db"
    cmd = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", "inprocess",
           "--db", str(alone)]
    for kv in [*spec["base"], "profile=very", *arm["set"]]:
        cmd += ["--set", kv]
    assert subprocess.run(cmd, capture_output=True, timeout=300).returncode == 0
    assert _final_hash(alone, "%") == _final_hash(tmp_path / "q.db",
                                                 "DN + DyLU, lr 0.7 @ very")
    # a second invocation reuses the finished runs instead of training again
    again = subprocess.run(
        [sys.executable, "-m", "fedlm", "sweep", str(ROOT / "experiments/configs/paper.toml"),
         "--quick", "--backend", "inprocess", "--db", str(tmp_path / "q.db"), "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("reusing run") == 8


def _final_hash(db: Path, name: str) -> str:
    with sqlite3.connect(db) as conn:
        (digest,), = conn.execute("SELECT final_hash FROM runs WHERE name LIKE ? "
                                  "AND status = 'finished'", (name,)).fetchall()
    assert digest
    return digest
