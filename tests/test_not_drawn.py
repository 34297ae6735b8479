"""Not drawn is not idle (docs/sampling.md): a worker free and there when a sampled round
is drawn, and not drawn in it, is ``not drawn`` until the round is over. The engine writes
that as an interval kind of its own, the summary, the yardstick and the sweep report take
it out of present time (idle, goodput and the shares leave it out) and give it apart; a
run that draws no round, and a store written before the kind, read as before; and the
kind changes nothing a job is given (the same final weights)."""

import json
import math
import sqlite3
from collections import defaultdict

import pytest

from fedlm import store
from fedlm.cli.runs import print_summary
from fedlm.engine.workers import WorkerPool
from fedlm.store.schema import PRESENT_KINDS, IntervalKind
from fedlm.store.yardstick import yardstick
from tests.conftest import tiny_config
from tests.support import run_engine

# 3 of 10 a round (4 dispatched, the first 3 kept): over-committed jobs come back late
SAMPLED = ("strategy=fedavg", "workers=10", "outer.fraction=0.3", "outer.overcommit=1.3",
           "profile=very", "updates=4")
ND = IntervalKind.NOT_DRAWN.value


def _rows(db, sql, *args):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def _seconds(db, kind) -> dict[int, float]:
    """Per worker: seconds of intervals of ``kind``."""
    return defaultdict(float, _rows(db, "SELECT worker, SUM(t_end - t_start) FROM intervals "
                                        "WHERE kind=? GROUP BY worker", kind))


def _expected_not_drawn(db) -> dict[int, float]:
    """Per worker, from the rounds' draws alone: for each round, the workers it was drawn
    from (its ``round_drawn`` event) less those it dispatched (jobs from its op to the
    next round's), for the round's length (its draw to the next draw, or the run's end)."""
    draws = [(t, json.loads(d)) for t, d in _rows(
        db, "SELECT virtual_time, detail FROM events WHERE kind='round_drawn' ORDER BY id")]
    (end,), = _rows(db, "SELECT virtual_time FROM runs")
    out: dict[int, float] = defaultdict(float)
    for k, (opened, draw) in enumerate(draws):
        closed, next_op = (draws[k + 1][0], draws[k + 1][1]["op"]) if k + 1 < len(draws) \
            else (end, math.inf)
        sent = {w for (w,) in _rows(db, "SELECT worker FROM jobs WHERE dispatch_op >= ? AND "
                                        "dispatch_op < ?", draw["op"], min(next_op, 2 ** 62))}
        for w in set(draw["offered"]) - sent:
            out[w] += closed - opened
    return out


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    db = tmp_path_factory.mktemp("nd") / "s.db"
    run_engine(tiny_config(*SAMPLED), db)
    return db


def test_not_drawn_time_is_the_rounds_draws_and_idle_no_longer_holds_it(sampled):
    want = _expected_not_drawn(sampled)
    got = _seconds(sampled, ND)
    assert sum(want.values()) > 0
    for w in range(10):
        assert got[w] == pytest.approx(want[w], abs=1e-6), w
    # idle holds only waiting in a round: a worker's counted kinds add up to the run's time
    # (nothing counted twice), and no idle span overlaps a not-drawn one
    (end,), = _rows(sampled, "SELECT virtual_time FROM runs")
    spans = defaultdict(list)
    for w, kind, a, b in _rows(sampled, "SELECT worker, kind, t_start, t_end FROM intervals "
                                        "WHERE kind IN ('idle', 'not drawn')"):
        spans[w].append((a, b, kind))
    for w in range(10):
        total = sum(s for (s,) in _rows(sampled, "SELECT SUM(t_end - t_start) FROM intervals "
                                                 "WHERE worker=? AND kind NOT IN "
                                                 "('hidden exchange', 'slowed')", w))
        assert total == pytest.approx(end, abs=1e-6)
        ordered = sorted(spans[w])
        assert all(b1 <= a2 + 1e-9 for (_, b1, _), (a2, _, _) in zip(ordered, ordered[1:]))


def test_the_summary_and_the_yardstick_leave_not_drawn_out_of_present_time(sampled, capsys):
    s = store.summarize(sampled, 1)
    y = yardstick(sampled, 1)
    spent = dict(_rows(sampled, "SELECT kind, SUM(t_end - t_start) FROM intervals "
                                "GROUP BY kind"))
    present = sum(spent.get(k, 0.0) for k in PRESENT_KINDS)
    assert ND not in PRESENT_KINDS and spent[ND] > 0
    assert y.goodput + y.unapplied + y.communication + y.idle == pytest.approx(1.0)
    assert y.idle == pytest.approx(spent["idle"] / present)
    assert y.not_drawn == pytest.approx(spent[ND] / (present + spent[ND]))
    assert s.idle_fraction == pytest.approx(y.idle)
    assert sum(w.not_drawn for w in s.workers) == pytest.approx(spent[ND])
    # counted as idle (what fedlm printed before), idle would be far larger
    assert (spent["idle"] + spent[ND]) / (present + spent[ND]) > y.idle + 0.3
    assert print_summary(str(sampled), 1) == 0
    out = capsys.readouterr().out
    assert f"straggler idle fraction (all workers): {100 * y.idle:.1f}% (of present time" in out
    assert f"idle {100 * y.idle:.1f}%" in out
    assert f"not drawn: {100 * y.not_drawn:.1f}% of the workers' time there" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("worker"))
    assert header.rstrip().endswith("not drawn")


def test_a_store_from_before_the_kind_reads_as_it_did(sampled, tmp_path, capsys):
    """An older fedlm wrote the same time as idle: such a store shows no not-drawn time,
    and its shares are today's with not drawn counted as idle."""
    old = tmp_path / "old.db"
    with sqlite3.connect(sampled) as src, sqlite3.connect(old) as dst:
        src.backup(dst)
    with sqlite3.connect(old) as conn:
        conn.execute("UPDATE intervals SET kind='idle' WHERE kind='not drawn'")
    new, was = yardstick(sampled, 1), yardstick(old, 1)
    assert was.not_drawn == 0 and was.bound == new.bound
    grown = 1 / (1 - new.not_drawn)  # present time with the not-drawn time back in it
    assert was.goodput == pytest.approx(new.goodput / grown)
    assert was.idle == pytest.approx((new.idle + new.not_drawn * grown) / grown)
    assert all(w.not_drawn == 0 for w in store.summarize(old, 1).workers)
    print_summary(str(old), 1)
    assert "not drawn" not in capsys.readouterr().out


def test_a_run_that_draws_no_round_writes_and_shows_no_not_drawn(tmp_path, capsys):
    db = tmp_path / "plain.db"
    run_engine(tiny_config("strategy=fedavg", "workers=4", "profile=very", "updates=3"), db)
    assert not _rows(db, "SELECT 1 FROM intervals WHERE kind='not drawn'")
    assert _rows(db, "SELECT COUNT(*) FROM intervals WHERE kind='idle'")[0][0] > 0
    assert yardstick(db, 1).not_drawn == 0
    print_summary(str(db), 1)
    out = capsys.readouterr().out
    assert "not drawn" not in out and "(of present time" not in out


def test_the_kind_of_an_interval_changes_no_weights(sampled, tmp_path, monkeypatch):
    """The same run with the engine marking nobody not drawn (what it did before: all of
    it idle) ends on the same weights, and its idle time is idle + not drawn of today's."""
    monkeypatch.setattr(WorkerPool, "left_out", lambda self, workers, now, version: [])
    old = tmp_path / "as_before.db"
    run_engine(tiny_config(*SAMPLED), old)
    assert _rows(old, "SELECT final_hash FROM runs") == _rows(sampled, "SELECT final_hash "
                                                                       "FROM runs")
    assert not _rows(old, "SELECT 1 FROM intervals WHERE kind='not drawn'")
    before, idle, nd = _seconds(old, "idle"), _seconds(sampled, "idle"), _seconds(sampled, ND)
    for w in range(10):
        assert before[w] == pytest.approx(idle[w] + nd[w], abs=1e-6)


def test_a_resumed_sampled_run_records_the_same_not_drawn_time(tmp_path):
    """The pool's not-drawn workers are in its checkpoint: a run stopped and resumed
    writes the spans an uninterrupted one does."""
    from fedlm.engine import Interrupted
    from fedlm.runner import run_inprocess

    cfg = tiny_config(*SAMPLED, "reliability.checkpoint_every=1")
    ref, cut, stop = tmp_path / "ref.db", tmp_path / "cut.db", []
    run_inprocess(cfg, str(ref))
    with pytest.raises(Interrupted):
        run_inprocess(cfg, str(cut), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= 2 else None)
    run_inprocess(cfg, str(cut), resume=1)
    assert _rows(cut, "SELECT final_hash FROM runs") == _rows(ref, "SELECT final_hash FROM runs")
    want, got = _seconds(ref, ND), _seconds(cut, ND)
    assert sum(want.values()) > 0
    for w in range(10):
        assert got[w] == pytest.approx(want[w], abs=1e-6), w


def test_on_a_churning_fleet_a_worker_not_drawn_that_goes_away_is_absent_from_then(
        tmp_path, monkeypatch):
    """A worker left out of a round that goes away meanwhile is not drawn until its
    absence began and absent after, as it was idle then absent before the kind: the
    absent spans are those of the same run with nobody marked, and its idle time is
    today's idle + not drawn; the weights are the same."""
    cfg = tiny_config("strategy=fedavg", "workers=12", "outer.fraction=0.25",
                      "fleet.availability={up=30, down=20}", "updates=6")
    db, old = tmp_path / "churn.db", tmp_path / "as_before.db"
    run_engine(cfg, db)
    with monkeypatch.context() as m:
        m.setattr(WorkerPool, "left_out", lambda self, workers, now, version: [])
        run_engine(cfg, old)
    assert _rows(db, "SELECT 1 FROM intervals WHERE kind='not drawn'")
    assert _rows(db, "SELECT final_hash FROM runs") == _rows(old, "SELECT final_hash FROM runs")
    away = "SELECT worker, t_start, t_end FROM intervals WHERE kind='absent' ORDER BY 1, 2"
    assert _rows(db, away) == _rows(old, away) and _rows(db, away)
    before, idle, nd = _seconds(old, "idle"), _seconds(db, "idle"), _seconds(db, ND)
    for w in range(12):
        assert before[w] == pytest.approx(idle[w] + nd[w], abs=1e-6), w


def test_the_sweep_report_gives_not_drawn_after_the_shares_of_present_time(sampled, tmp_path):
    """The time-spent cell of a sampled arm: the four shares of present time (adding up
    as before), then its not-drawn share; an arm that drew no round: the four alone."""
    from types import SimpleNamespace

    from fedlm.sweep.report import _Report

    plain = tmp_path / "plain.db"
    run_engine(tiny_config("strategy=fedavg", "workers=4", "profile=very", "updates=2"), plain)
    for db, sampled_arm in ((sampled, True), (plain, False)):
        y = yardstick(db, 1)
        me = SimpleNamespace(yardsticks={1: y})
        text = _Report.time_spent(me, "arm", {0: SimpleNamespace(run_id=1)})
        shares = " / ".join(f"{100 * v:.0f}" for v in (y.goodput, y.unapplied,
                                                       y.communication, y.idle))
        assert text == shares + (f"; not drawn {100 * y.not_drawn:.0f}" if sampled_arm
                                 else "")
