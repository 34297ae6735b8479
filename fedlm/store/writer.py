"""The writer of one run: buffered rows, short transactions, an ownership heartbeat.

A run's rows (jobs, updates, intervals, metrics, events) are buffered in memory
and written together in one short ``BEGIN IMMEDIATE`` transaction (about every
``RunWriter.FLUSH_EVERY`` seconds, at evaluations and at the end), retried with
back-off while another writer holds the lock: no transaction stays open across
training, evaluation or a checkpoint, so the writers of many runs interleave
instead of taking turns.

Each run records the process that writes it (``fedlm.ownership``); a heartbeat
thread keeps it fresh, every flush checks that this writer still owns the run
(a writer taken over by ``fedlm run --resume`` stops), and readers show a
``running`` run whose writer is gone as ``crashed``. ``mark_ended`` records the
end of a run through a connection of its own when the writer's is stuck.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Iterable

from fedlm import ownership
from fedlm.store.connection import (StoreError, connect, db_error, transaction, with_retries,
                                    writer_connection)
from fedlm.store.readers import diverged_refusal
from fedlm.store.schema import AWAY_EVENT, IntervalKind, store_id


class RunWriter:
    """Everything the engine writes about one run.

    Rows are buffered and written together in one short transaction at most
    every ``FLUSH_EVERY`` seconds (``commit(force=False)``), at evaluations and
    at the end (``commit()``), so a live reader sees the run advance without a
    transaction per job slowing big runs down, and no lock is held while the
    run trains. The writer owns its run (``fedlm.ownership``): a heartbeat
    thread marks it alive until ``finish`` or ``close``."""

    FLUSH_EVERY = 0.25

    def __init__(self, path: str | Path, *, name: str, strategy: str, local_steps: str,
                 profile: str, model: str, workers: int, seed: int, clock: str,
                 config_json: str, strategy_summary: str = "") -> None:
        self._open(path)
        me = self.owner
        now = time.time()

        def insert(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT INTO runs (name, status, strategy, local_steps, profile, model, workers,"
                " seed, clock, config_json, strategy_summary, created_at, owner_host, owner_pid,"
                " owner_started, heartbeat_at)"
                " VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (name, strategy, local_steps, profile, model, workers, seed, clock, config_json,
                 strategy_summary, now, me.host, me.pid, me.started, now))
            return int(cur.lastrowid)

        try:
            self.run_id = transaction(self.conn, insert)
        except BaseException:
            self.conn.close()
            raise
        self.created_at = now
        self._start_heartbeat()

    def _open(self, path: str | Path) -> None:
        self.path = Path(path)
        self.conn = connect(self.path)
        self.store_id = store_id(self.conn)
        self.owner = ownership.current()
        self._pending: list[tuple[str, Any, bool]] = []  # (sql, parameters, executemany)
        self._last_flush = time.monotonic()
        self._heartbeat: ownership.Heartbeat | None = None

    @classmethod
    def reopen(cls, path: str | Path, run_id: int) -> "RunWriter":
        """A writer for an existing run (``fedlm run --resume``): takes the run over
        from its previous writer, which must be gone (``StoreError`` if it is alive
        or the run has finished)."""
        self = cls.__new__(cls)
        self._open(path)
        me = self.owner

        def take_over(conn: sqlite3.Connection) -> float:
            row = conn.execute("SELECT status, owner_host, owner_pid, owner_started,"
                               " heartbeat_at, created_at, error, finished_at FROM runs"
                               " WHERE id=?", (run_id,)).fetchone()
            if row is None:
                raise StoreError(f"--resume: no run {run_id} in {path}")
            status, host, pid, started, heartbeat_at, created_at, error, ended = row
            if status == "finished":
                raise StoreError(f"--resume: run {run_id} in {path} has already finished")
            if status == "diverged":
                raise StoreError(diverged_refusal(path, run_id, error))
            if status == "running":
                alive = ownership.judge(host, pid, started, heartbeat_at)
                if alive.alive:
                    raise StoreError(f"--resume: run {run_id} in {path} is still running "
                                     f"({alive.why}); two writers would break its log")
            now = time.time()
            conn.execute("UPDATE runs SET owner_host=?, owner_pid=?, owner_started=?,"
                         " heartbeat_at=? WHERE id=?", (me.host, me.pid, me.started, now, run_id))
            # the run's last sign of life before this process: its time away is no run time
            last = max((t for t in (heartbeat_at, ended, created_at) if _is_time(t)), default=now)
            self.away = max(0.0, now - last)
            return created_at

        try:
            self.created_at = transaction(self.conn, take_over)
        except BaseException:
            self.conn.close()
            raise
        self.run_id = run_id
        self._start_heartbeat()
        return self

    def _start_heartbeat(self) -> None:
        run_id = self.run_id
        me = self.owner
        conn = writer_connection(self.path)  # its own: the heartbeat runs on its own thread

        def beat() -> None:
            conn.execute("UPDATE runs SET heartbeat_at=? WHERE id=? AND owner_pid=? AND"
                         " owner_host=?", (time.time(), run_id, me.pid, me.host))

        self._heartbeat_conn = conn
        self._heartbeat = ownership.Heartbeat(beat)

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat_conn.close()
            self._heartbeat = None

    # -- buffered writes ------------------------------------------------------
    def _queue(self, sql: str, parameters: Any, many: bool = False) -> None:
        self._pending.append((sql, parameters, many))

    def _flush(self) -> None:
        """Write every buffered row in one transaction. On failure the rows stay
        buffered, so a later flush can try again."""
        if not self._pending:
            return
        pending = self._pending
        me = self.owner

        def write(conn: sqlite3.Connection) -> None:
            # fenced: a writer taken for dead and taken over (--resume) writes no more
            owner = conn.execute("SELECT owner_host, owner_pid FROM runs WHERE id=?",
                                 (self.run_id,)).fetchone()
            if owner != (me.host, me.pid):
                raise StoreError(f"db: run {self.run_id} was taken over by pid {owner[1]} on "
                                 f"{owner[0]} (fedlm run --resume); this writer stops")
            for sql, parameters, many in pending:
                (conn.executemany if many else conn.execute)(sql, parameters)

        transaction(self.conn, write)
        self._pending = []
        self._last_flush = time.monotonic()

    def commit(self, force: bool = True) -> None:
        """Write the buffered rows now (``force``), or only if the last write is
        older than FLUSH_EVERY."""
        if force or time.monotonic() - self._last_flush >= self.FLUSH_EVERY:
            self._flush()

    def positions(self) -> dict[str, int]:
        """How far each log table has got (written rows); a checkpoint stores it."""
        self._flush()
        q = "SELECT COALESCE(MAX(id), 0) FROM {} WHERE run_id=?"
        return {t: int(self.conn.execute(q.format(t), (self.run_id,)).fetchone()[0])
                for t in ("intervals", "metrics", "events", "transfers")}

    def rewind(self, positions: dict[str, int], *, next_job_id: int, seq: int,
               version: int, in_flight: list[int]) -> None:
        """Forget what the run logged after a checkpoint: rows past ``positions``,
        jobs from ``next_job_id``, updates from ``seq``; the checkpoint's jobs in
        flight are running again and its held updates not yet applied."""
        r = self.run_id
        self._flush()

        def cut(conn: sqlite3.Connection) -> None:
            for table, last in positions.items():
                # an earlier resume's time away stays, whatever is cut: it is no run time
                away = " AND kind<>?" if table == "events" else ""
                conn.execute(f"DELETE FROM {table} WHERE run_id=? AND id>?{away}",
                             (r, last, AWAY_EVENT) if away else (r, last))
            conn.execute("DELETE FROM jobs WHERE run_id=? AND job_id>=?", (r, next_job_id))
            conn.execute("DELETE FROM updates WHERE run_id=? AND seq>=?", (r, seq))
            conn.executemany("UPDATE jobs SET status='running', end_op=NULL, computed=NULL,"
                             " reason=NULL WHERE run_id=? AND job_id=?",
                             [(r, j) for j in in_flight])
            conn.execute("UPDATE updates SET applied_version=NULL WHERE run_id=?"
                         " AND applied_version>?", (r, version))
            conn.execute("UPDATE runs SET status='running', finished_at=NULL, error=NULL,"
                         " final_hash=NULL WHERE id=?", (r,))

        transaction(self.conn, cut)

    def set_model_info(self, num_parameters: int, initial_hash: str,
                       start_hash: str | None = None) -> None:
        """The model's size, the hash of its seeded initialisation and of the weights
        the federated phase starts from (they differ after ``init.*``)."""
        self._queue("UPDATE runs SET num_parameters=?, initial_hash=?, start_hash=? WHERE id=?",
                    (num_parameters, initial_hash, start_hash or initial_hash, self.run_id))
        self._flush()

    def add_workers(self, rows: Iterable[dict[str, Any]]) -> None:
        self._queue(
            "INSERT OR REPLACE INTO workers VALUES (:run_id, :worker, :node_id, :step_time, :jitter,"
            " :region, :latency, :down_bw, :up_bw, :shard_sequences)",
            [{"run_id": self.run_id, **r} for r in rows], many=True)
        self._flush()

    def add_intervals(self, rows: Iterable[tuple[int, IntervalKind, float, float, int, int]]) -> None:
        """Rows of (worker, kind, t_start, t_end, version, job_id); empty spans skipped."""
        self._queue(
            "INSERT INTO intervals (run_id, worker, kind, t_start, t_end, version, job_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(self.run_id, w, IntervalKind(k).value, a, b, v, j)
             for w, k, a, b, v, j in rows if b > a], many=True)

    def add_update(self, row: dict[str, Any]) -> None:
        self._queue(
            "INSERT INTO updates VALUES (:run_id, :seq, :op, :job_id, :worker, :base_version,"
            " :received_version, NULL, :staleness, :local_steps, :data_seed, :tokens,"
            " :train_loss, :t_dispatch, :t_done, :wall_arrival, :compute_seconds, :update_hash)",
            {"run_id": self.run_id, **row})

    def add_job(self, job, *, op: int, t_dispatch: float, down_bytes: int | None = None,
                up_bytes: int | None = None) -> None:
        self._queue(
            "INSERT INTO jobs (run_id, job_id, worker, base_version, local_steps, data_seed,"
            " dispatch_op, t_dispatch, status, prev_job, fault, down_bytes, up_bytes, shard,"
            " cursor, schedule_step) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?,"
            " ?, ?)",
            (self.run_id, job.job_id, job.worker, job.base_version, job.local_steps,
             job.data_seed, op, t_dispatch, job.prev_job, job.fault, down_bytes, up_bytes,
             job.shard, job.cursor, job.schedule_step))

    def end_job(self, job_id: int, *, status: str, op: int, computed: bool = True,
                reason: str | None = None) -> None:
        self._queue("UPDATE jobs SET status=?, end_op=?, computed=?, reason=?"
                    " WHERE run_id=? AND job_id=?",
                    (status, op, int(computed), reason, self.run_id, job_id))

    def cancel_jobs(self, job_ids: list[int], *, reason: str) -> None:
        """Jobs in flight when the run ended: ``cancelled``, no end op (``rewind``
        makes a checkpoint's ones running again)."""
        self._queue("UPDATE jobs SET status='cancelled', end_op=NULL, computed=NULL, reason=?"
                    " WHERE run_id=? AND job_id=? AND status='running'",
                    [(reason, self.run_id, j) for j in job_ids], many=True)

    def mark_applied(self, version: int, seqs: list[int]) -> None:
        """The updates ``seqs`` (held until now) are part of global ``version``."""
        self._queue("UPDATE updates SET applied_version=? WHERE run_id=? AND seq=?",
                    [(version, self.run_id, q) for q in seqs], many=True)

    def add_metric(self, *, version: int, virtual_time: float, wall_time: float, tokens: int,
                   jobs: int, loss: float, perplexity: float, bits_per_byte: float) -> None:
        self._queue(
            "INSERT INTO metrics (run_id, version, virtual_time, wall_time, tokens, jobs, loss,"
            " perplexity, bits_per_byte) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.run_id, version, virtual_time, wall_time, tokens, jobs, loss, perplexity,
             bits_per_byte))

    def add_transfer(self, row: dict[str, Any]) -> None:
        """A two-level strategy's transfer that arrived (the ``transfers`` columns)."""
        self._queue(
            "INSERT INTO transfers (run_id, op, key, kind, region, bytes, t_sent, t_arrived,"
            " staleness, version) VALUES (:run_id, :op, :key, :kind, :region, :bytes, :t_sent,"
            " :t_arrived, :staleness, :version)", {"run_id": self.run_id, **row})

    def add_event(self, *, kind: str, virtual_time: float, worker: int | None = None,
                  job_id: int | None = None, detail: str = "") -> None:
        self._queue(
            "INSERT INTO events (run_id, virtual_time, wall_time, kind, worker, job_id, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.run_id, virtual_time, time.time(), kind, worker, job_id, detail))

    # -- the end ----------------------------------------------------------------
    def finish(self, *, status: str, virtual_time: float, updates: int,
               final_hash: str | None, error: str | None = None) -> None:
        """Record how the run ended, with every buffered row. A run that did not
        finish is recorded even when its rows cannot be (the store stuck, the
        disk full): then through a fresh connection, with the rows dropped."""
        self._queue("UPDATE runs SET status=?, finished_at=?, virtual_time=?, updates=?,"
                    " final_hash=?, error=? WHERE id=?",
                    (status, time.time(), virtual_time, updates, final_hash, error, self.run_id))
        try:
            self._flush()
        except (sqlite3.Error, OSError) as exc:
            if status == "finished":
                raise
            self._pending = []
            mark_ended(self.path, self.run_id, status=status, virtual_time=virtual_time,
                       updates=updates, error=f"{error} (and its last rows were not written: "
                                                f"{db_error(self.path, exc)})")
        self._stop_heartbeat()

    def close(self) -> None:
        self._stop_heartbeat()
        self.conn.close()


def mark_ended(path: str | Path, run_id: int, *, status: str, virtual_time: float,
               updates: int, error: str) -> None:
    """Record that run ``run_id`` ended without finishing, through a connection of
    its own (the writer's may be the thing that is stuck), with retries."""
    with closing(writer_connection(Path(path))) as conn:
        with_retries(lambda: conn.execute(
            "UPDATE runs SET status=?, finished_at=?, virtual_time=?, updates=?, final_hash=NULL,"
            " error=? WHERE id=?", (status, time.time(), virtual_time, updates, error, run_id)))


def end_if_running(path: str | Path, run_id: int, *, status: str, error: str) -> bool:
    """Record that run ``run_id`` ended (``status``, ``error``) if its row still says it is
    running, through a connection of its own: for a run whose engine thread is blocked
    and will never record it (``fedlm.flower.simulation``). Whether it did."""
    with closing(writer_connection(Path(path))) as conn:
        done = with_retries(lambda: conn.execute(
            "UPDATE runs SET status=?, finished_at=?, final_hash=NULL, error=? "
            "WHERE id=? AND status='running'", (status, time.time(), error, run_id)))
        return done.rowcount == 1


def _is_time(value: Any) -> bool:
    """Whether a stored timestamp is one (a damaged row may hold anything)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and 0 <= value < 1e11
