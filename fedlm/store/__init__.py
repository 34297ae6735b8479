"""The run store: SQLite in WAL mode, one file for many runs. All of fedlm's SQL is here.

Any number of runs write one file at once (``fedlm sweep --jobs N``, several
``fedlm run``), and any number of readers (CLI, dashboard, replay) read it
while they do. A writer buffers its rows in memory and writes them in short
``BEGIN IMMEDIATE`` transactions, retried with back-off while another writer
holds the lock; WAL lets readers go on while a writer commits; readers open
the file read-only. Each run records the process that writes it
(``fedlm.ownership``): readers show a ``running`` run whose writer is gone as
``crashed``.

    schema.py      the tables, SCHEMA_VERSION, migrations of older versions, IntervalKind
    connection.py  connect (writer), connect_readonly, retries and transactions,
                   FEDLM_DB_TIMEOUT, the one-line StoreError (db_error), check_writable
    writer.py      RunWriter (buffered rows, ownership heartbeat), mark_ended, end_if_running
    summary.py     summarize, troubles: what fedlm show prints of a run
    readers.py     list_runs, config_of, tokenizer_of, shown_status,
                   last_seen, run_row, operation_log (replay), metric_curve, best_loss, uploaded_bytes,
                   traffic
    damage.py      what is damaged in a run's rows (a value of the wrong type, a config
                   that is not JSON): listed as damaged, refused in one line where read
    export.py      export: a run's rows as CSV or Parquet
    fleet_changes.py  fleet_changes: per worker, absences, slow-downs, stragglers,
                   departures, joins and leaves (a fleet that changes over time)
    progress.py    progress_points: each evaluation with the fleet's running totals by then
                   (what the experiment trackers get, fedlm.track)
    dashboard.py   the dashboard's reads, as pandas frames (import it explicitly:
                   ``from fedlm.store import dashboard``; it loads pandas)

Callers import from the package (``from fedlm.store import RunWriter``), not from
the modules, except for ``fedlm.store.dashboard``.
"""

from fedlm.store.connection import (StoreError, check_writable, connect, connect_readonly,
                                    db_error, db_timeout, transaction, with_retries)
from fedlm.store.export import export  # the function; the module is fedlm.store.export too
from fedlm.store.fleet_changes import WorkerChanges, fleet_changes
from fedlm.store.progress import ProgressPoint, progress_points
from fedlm.store.readers import (OperationLog, config_of, event_details, input_pins, last_seen,
                                 list_runs, operation_log, replayable_row, resumable_row, run_row,
                                 shown_status, tokenizer_of)
from fedlm.store.summary import RunSummary, Troubles, WorkerSummary, summarize, troubles
from fedlm.store.series import (best_loss, metric_curve, region_transfers, tokens_curve, traffic,
                                uploaded_bytes)
from fedlm.store.schema import SCHEMA_VERSION, TABLES, IntervalKind, store_id
from fedlm.store.writer import RunWriter, end_if_running, mark_ended

__all__ = [
    "SCHEMA_VERSION", "TABLES", "IntervalKind", "OperationLog", "ProgressPoint", "RunSummary", "WorkerChanges",
    "RunWriter",
    "StoreError", "Troubles", "WorkerSummary", "best_loss", "check_writable", "config_of",
    "connect",
    "connect_readonly", "db_error", "db_timeout", "end_if_running", "event_details", "export", "fleet_changes", "input_pins", "last_seen",
    "list_runs",
    "mark_ended", "metric_curve", "tokens_curve", "operation_log", "progress_points",
    "region_transfers",
    "replayable_row",
    "resumable_row", "run_row", "shown_status", "store_id",
    "summarize", "tokenizer_of", "traffic", "transaction", "troubles", "uploaded_bytes", "with_retries",
]
