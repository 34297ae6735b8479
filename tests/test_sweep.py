"""The paper sweep's --quick mode, end to end on the tiny model (in-process backend)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_paper_sweep_writes_tables_and_plots(tmp_path):
    out = tmp_path / "results" / "paper_quick.md"
    proc = subprocess.run(
        [sys.executable, "-m", "fedlm", "sweep", str(ROOT / "experiments/configs/paper.toml"),
         "--quick", "--backend", "inprocess", "--db", str(tmp_path / "q.db"), "--out", str(out)],
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
    # a second invocation reuses the finished runs instead of training again
    again = subprocess.run(
        [sys.executable, "-m", "fedlm", "sweep", str(ROOT / "experiments/configs/paper.toml"),
         "--quick", "--backend", "inprocess", "--db", str(tmp_path / "q.db"), "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("reusing run") == 12
