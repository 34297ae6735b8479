"""A run whose validation loss blows up stops, marked diverged, with one line saying
where and what to try (eval.diverge_factor; fedlm.engine.divergence)."""

import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fedlm import config_load, store
from fedlm.engine import Diverged
from fedlm.engine.divergence import DivergenceWatch
from fedlm.errors import ConfigError
from tests.conftest import tiny_config
from tests.support import run_engine

ROOT = Path(__file__).resolve().parent.parent
HINT = "the outer learning rate is likely too high for diloco; try a smaller outer.lr (now 9)"
# An outer step far too large: the loss goes 5.55, 5.35, then 21.3 at version 2 (4.0x).
BLOWS_UP = ["model=tiny", "workers=2", "updates=4", "inner.steps=2", "inner.batch_size=2",
            "eval.every=1", "eval.batches=1", "eval.batch_size=4", "data.seq_len=64",
            "outer.lr=300"]


def test_a_loss_above_the_factor_times_the_best_is_divergence():
    watch = DivergenceWatch(3.0, HINT)
    for version, loss in enumerate([5.5, 4.3, 6.0, 4.4, 12.8]):  # 12.8 < 3 x 4.3: noise
        assert watch.check(version, loss) is None
    assert watch.best == (4.3, 1)
    why = watch.check(5, 17.9)
    assert why == ("validation loss 17.9 at version 5 is 4.2x its best (4.3 at version 1): "
                   + HINT)


@pytest.mark.parametrize("loss", [math.nan, math.inf])
def test_a_non_finite_loss_is_divergence_whatever_the_factor(loss):
    for factor in (3.0, 0.0):
        watch = DivergenceWatch(factor, HINT)
        assert watch.check(0, 5.5) is None
        assert watch.check(2, loss) == (f"validation loss is {loss} at version 2 (best 5.5 "
                                        f"at version 0): the global model has non-finite "
                                        f"weights; " + HINT)
    first = DivergenceWatch(3.0, HINT).check(0, loss)  # nothing trained yet: the start
    assert "the first evaluation" in first and "init.from" in first


def test_factor_zero_only_stops_on_non_finite_losses():
    watch = DivergenceWatch(0.0, HINT)
    assert watch.check(0, 1.0) is None and watch.check(1, 1e6) is None


def test_a_resumed_watch_starts_from_the_best_before_the_checkpoint():
    watch = DivergenceWatch(3.0, HINT)
    watch.seed(3.0, 4)
    assert watch.check(6, 9.5) is not None  # 3.2x the best from before the resume


@pytest.mark.parametrize("factor", ["0.5", "1", "-2"])
def test_a_factor_that_would_stop_healthy_runs_is_refused(factor):
    with pytest.raises(ConfigError, match=rf"^eval.diverge_factor: must be 0 \(only non-finite "
                                          rf"losses\) or > 1, got {factor}"):
        config_load.load(None, [f"eval.diverge_factor={factor}"])
    assert config_load.load(None, ["eval.diverge_factor=0"]).eval.diverge_factor == 0


def test_the_engine_stops_at_the_version_that_diverged(tmp_path):
    cfg = tiny_config(*BLOWS_UP)
    with pytest.raises(Diverged) as caught:
        run_engine(cfg, tmp_path / "r.db")
    assert caught.value.version == 2
    assert str(caught.value).startswith("validation loss 21.3 at version 2 is 4.0x its best "
                                        "(5.35 at version 1): the outer learning rate is "
                                        "likely too high for diloco; try a smaller outer.lr "
                                        "(now 300)")
    with sqlite3.connect(tmp_path / "r.db") as conn:
        assert [v for (v,) in conn.execute("SELECT version FROM metrics")] == [0, 1, 2]
        assert conn.execute("SELECT detail FROM events WHERE kind='diverged'").fetchall() == [
            (str(caught.value),)]
        assert conn.execute("SELECT MAX(applied_version) FROM updates").fetchone()[0] == 2


def test_weights_gone_non_finite_stop_the_run_and_the_store_takes_it(tmp_path):
    # outer.lr=1e30: the weights overflow, the loss is NaN; no metrics row can hold
    # it (SQLite stores NaN as NULL), so the diverged event does
    cfg = tiny_config(*BLOWS_UP, "outer.lr=1e30")
    with pytest.raises(Diverged, match=r"^validation loss is nan at version 1 \(best 5.55 "
                                       r"at version 0\): the global model has non-finite"):
        run_engine(cfg, tmp_path / "r.db")
    with sqlite3.connect(tmp_path / "r.db") as conn:
        assert [v for (v,) in conn.execute("SELECT version FROM metrics")] == [0]


def test_a_model_the_outer_step_broke_between_evaluations_is_divergence_not_failures(
        tmp_path):
    """outer.lr=1e30 with eval.every=5: version 1 is not evaluated on schedule, every job
    sent it comes back NaN, and the run ended "every worker failed 3 jobs in a row"
    (the workers blamed for the server's step). A NaN update from a model not yet
    evaluated has that model evaluated now."""
    cfg = tiny_config(*BLOWS_UP, "outer.lr=1e30", "eval.every=5", "updates=6")
    with pytest.raises(Diverged, match=r"^validation loss is nan at version 1 \(best 5.55 "
                                       r"at version 0\): the global model has non-finite "
                                       r"weights; the outer learning rate is likely too high"):
        run_engine(cfg, tmp_path / "r.db")
    with sqlite3.connect(tmp_path / "r.db") as conn:  # one job's NaN was enough
        assert conn.execute("SELECT COUNT(*) FROM jobs WHERE reason='rejected'").fetchone() \
            == (1,)
    # an injected NaN (faults.nan) is the worker's, and evaluates nothing more
    cfg = tiny_config("faults.nan=0.5", "eval.every=5", "updates=4")
    run_engine(cfg, tmp_path / "f.db")
    with sqlite3.connect(tmp_path / "f.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM jobs WHERE fault='nan'").fetchone()[0] > 0
        assert [v for (v,) in conn.execute("SELECT version FROM metrics")] == [0, 4]


def test_fedlm_run_says_it_in_one_line_and_exits_3(tmp_path):
    db = tmp_path / "d.db"
    cmd = [sys.executable, "-m", "fedlm", "run", "--backend", "inprocess", "--quiet",
           "--db", str(db)]
    for kv in BLOWS_UP:
        cmd += ["--set", kv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 3, out.stderr[-3000:]
    (run,) = store.list_runs(db)
    assert (run["status"], run["updates"], run["final_hash"]) == ("diverged", 2, None)
    assert run["error"].startswith("validation loss 21.3 at version 2 is 4.0x its best")
    assert out.stderr.splitlines() == [f"fedlm: run 1 diverged: {run['error']}"]

    show = subprocess.run([sys.executable, "-m", "fedlm", "show", "1", "--db", str(db)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert (show.returncode, show.stderr.splitlines()) == (3, out.stderr.splitlines())
    for argv, refusal in ((["replay", "1"], "only finished runs replay"),
                          (["run", "--resume", "1"], "resuming it would diverge again")):
        again = subprocess.run([sys.executable, "-m", "fedlm", *argv, "--db", str(db)],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
        (line,) = again.stderr.splitlines()  # no progress bar before the refusal either
        assert line.startswith("fedlm: error: ") and refusal in line and "diverged (" in line
