"""A run's summary, what ``fedlm show`` and the end of ``fedlm run`` print: per worker its
jobs, compute, communication, idle and not-drawn time; the run's totals, clocks and
perplexities (``summarize``); and what went wrong and was handled (``troubles``).
Read-only, as every reader (``connect_readonly``); a damaged run is refused in one line
(``fedlm.store.damage``).
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from fedlm.store.connection import connect_readonly
from fedlm.store.damage import refuse_damaged
from fedlm.store.readers import shown_status, tokenizer_of
from fedlm.store.schema import AWAY_EVENT, EXPOSED_COMM_KINDS, IntervalKind, idle_fraction


@dataclass(frozen=True)
class WorkerSummary:
    worker: int
    step_time: float
    region: str
    jobs: int
    compute: float
    communication: float  # exposed: download, upload, exchange, waiting for the shared link
    idle: float
    idle_fraction: float
    hidden: float = 0.0  # exchange behind compute (Streaming DiLoCo's overlap), not counted
    # left out of sampled rounds (IntervalKind.NOT_DRAWN): not idle, not present time
    not_drawn: float = 0.0


@dataclass(frozen=True)
class RunSummary:
    run_id: int
    name: str
    status: str
    strategy: str
    profile: str
    model: str
    clock: str  # virtual | wall (Config.clock)
    workers: list[WorkerSummary]
    updates: int
    jobs: int
    tokens: int
    local_steps: int
    virtual_time: float
    wall_time: float  # real time its processes ran: a resumed run's time away left out
    first_perplexity: float | None  # per token: compares runs of one tokenizer
    final_perplexity: float | None
    best_perplexity: float | None
    final_hash: str | None
    # data.tokenizer, and bits per byte, which compares runs of any tokenizers
    tokenizer: str = "byte"
    first_bits_per_byte: float | None = None
    final_bits_per_byte: float | None = None
    best_bits_per_byte: float | None = None
    start_hash: str | None = None  # of the weights its federated phase started from

    @property
    def idle_fraction(self) -> float:
        """Idle over present time, all workers together (``schema.idle_fraction``: a
        worker's compute, exposed communication and idle time are its time present; time
        it was not drawn in a sampled round is not)."""
        present = sum(w.compute + w.communication + w.idle for w in self.workers)
        return sum(w.idle for w in self.workers) / present if present else 0.0




def summarize(path: str | Path, run_id: int) -> RunSummary:
    """Run ``run_id``'s summary (``KeyError`` if there is none; ``StoreError`` naming
    what is damaged if its rows are: ``damage``)."""
    refuse_damaged(path, run_id)
    with closing(connect_readonly(path)) as conn:
        run = conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if run is None:
            raise KeyError(f"no run {run_id} in {path}")
        metrics = conn.execute("SELECT * FROM metrics WHERE run_id=? ORDER BY id",
                               (run_id,)).fetchall()
        end = run["virtual_time"]
        if end is None:
            end = conn.execute("SELECT COALESCE(MAX(t_end), 0) FROM intervals WHERE run_id=?",
                               (run_id,)).fetchone()[0]
        workers = []
        for w in conn.execute("SELECT * FROM workers WHERE run_id=? ORDER BY worker", (run_id,)):
            spans = dict(conn.execute(
                "SELECT kind, SUM(t_end - t_start) FROM intervals WHERE run_id=? AND worker=?"
                " GROUP BY kind", (run_id, w["worker"])).fetchall())
            jobs = conn.execute("SELECT COUNT(*) FROM updates WHERE run_id=? AND worker=?",
                                (run_id, w["worker"])).fetchone()[0]
            idle = spans.get("idle", 0.0)
            workers.append(WorkerSummary(
                w["worker"], w["step_time"], w["region"], jobs, spans.get("compute", 0.0),
                sum(spans.get(k, 0.0) for k in EXPOSED_COMM_KINDS), idle,
                idle_fraction(spans), spans.get(IntervalKind.HIDDEN.value, 0.0),
                spans.get(IntervalKind.NOT_DRAWN.value, 0.0)))
        tokens, jobs, steps = conn.execute(
            "SELECT COALESCE(SUM(tokens), 0), COUNT(*), COALESCE(SUM(local_steps), 0)"
            " FROM updates WHERE run_id=?", (run_id,)).fetchone()
        away = _away(conn, run_id)
    ppl = [m["perplexity"] for m in metrics]
    bpb = [m["bits_per_byte"] for m in metrics]
    return RunSummary(
        run_id, run["name"], shown_status(run), run["strategy"], run["profile"], run["model"],
        run["clock"], workers, run["updates"] or (metrics[-1]["version"] if metrics else 0), jobs, tokens,
        steps, end, (run["finished_at"] or time.time()) - run["created_at"] - away,
        ppl[0] if ppl else None, ppl[-1] if ppl else None, min(ppl) if ppl else None,
        run["final_hash"], tokenizer_of(run["config_json"]),
        bpb[0] if bpb else None, bpb[-1] if bpb else None, min(bpb) if bpb else None,
        run["start_hash"] or run["initial_hash"])


def _away(conn: sqlite3.Connection, run_id: int) -> float:
    """Seconds a resumed run was away (between a process's last sign of life and the
    resume that took it over: ``AWAY_EVENT``), which are no run time."""
    total = 0.0
    for (detail,) in conn.execute("SELECT detail FROM events WHERE run_id=? AND kind=?",
                                  (run_id, AWAY_EVENT)):
        try:
            total += max(0.0, float(str(detail).split()[0]))
        except (ValueError, IndexError):  # not written by fedlm: counted as run time
            continue
    return total


@dataclass(frozen=True)
class Troubles:
    """What went wrong in a run and was handled: for ``fedlm show``."""

    faults: dict[str, int]  # injected faults by kind (faults.*)
    lost: dict[str, int]  # lost jobs by reason: error | rejected | deadline | retired
    retired: list[tuple[int, str]]  # (worker, why), in the order they were retired
    ignored: dict[str, int]  # replies ignored: late_reply | duplicate_reply
    rounds_closed: int  # sync rounds closed at their deadline without every reply
    offline: dict[int, int]  # worker -> offline periods

    def __bool__(self) -> bool:
        return any((self.faults, self.lost, self.retired, self.ignored, self.rounds_closed,
                    self.offline))


def troubles(path: str | Path, run_id: int) -> Troubles:
    """Faults, lost jobs, retired workers and the like of run ``run_id``."""
    with closing(connect_readonly(path)) as conn:
        def counts(sql: str) -> dict:
            return {k: n for k, n in conn.execute(sql, (run_id,)).fetchall()}

        faults = counts("SELECT detail, COUNT(*) FROM events WHERE run_id=? AND"
                        " kind='fault_injected' GROUP BY detail ORDER BY detail")
        lost = counts("SELECT COALESCE(reason, 'unknown'), COUNT(*) FROM jobs WHERE run_id=?"
                      " AND status='lost' GROUP BY 1 ORDER BY 1")
        retired = [(w, d) for w, d in conn.execute(
            "SELECT worker, detail FROM events WHERE run_id=? AND kind='worker_retired'"
            " ORDER BY id", (run_id,))]
        ignored = counts("SELECT kind, COUNT(*) FROM events WHERE run_id=? AND kind IN"
                         " ('late_reply', 'duplicate_reply') GROUP BY kind ORDER BY kind")
        closed = conn.execute("SELECT COUNT(*) FROM events WHERE run_id=? AND"
                              " kind='round_closed'", (run_id,)).fetchone()[0]
        offline = counts("SELECT worker, COUNT(*) FROM events WHERE run_id=? AND"
                         " kind='worker_offline' GROUP BY worker ORDER BY worker")
    return Troubles(faults, lost, retired, ignored, closed, offline)
