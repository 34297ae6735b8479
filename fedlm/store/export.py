"""Exporting one run: each table's rows of the run as CSV or Parquet files.

``fedlm export RUN_ID --out DIR [--format csv|parquet]`` writes one file per
table (``run<ID>_<table>.<fmt>``), read through a read-only connection.
pandas is imported only here, when a run is exported.
"""

from __future__ import annotations

import os
from contextlib import closing
from pathlib import Path

from fedlm.files import kind
from fedlm.store.connection import StoreError, connect_readonly
from fedlm.store.schema import TABLES


def export(path: str | Path, run_id: int, out_dir: str | Path, fmt: str = "csv") -> list[Path]:
    """Write each table's rows of ``run_id`` to ``out_dir`` as CSV or Parquet."""
    import pandas as pd

    if fmt not in ("csv", "parquet"):
        raise ValueError(f"format: must be csv or parquet, got {fmt!r}")
    out = Path(out_dir)
    targets = {table: out / f"run{run_id}_{table}.{fmt}" for table in TABLES}
    _check_out(out, targets.values())
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with closing(connect_readonly(path)) as conn:
        if conn.execute("SELECT 1 FROM runs WHERE id=?", (run_id,)).fetchone() is None:
            raise KeyError(f"no run {run_id} in {path}")
        for table in TABLES:
            key = "id" if table == "runs" else "run_id"
            frame = pd.read_sql_query(f"SELECT * FROM {table} WHERE {key}=?", conn,
                                      params=(run_id,))
            target = targets[table]
            if fmt == "csv":
                frame.to_csv(target, index=False)
            else:
                frame.to_parquet(target, index=False)
            written.append(target)
    return written


def _check_out(out: Path, targets) -> None:
    """``StoreError`` in one line, before anything is written, unless ``out`` is a folder
    (or can be made one) whose files of these names, where they exist, are regular files
    (a FIFO there would block the write for ever; a folder would fail it half-way)."""
    for folder in (out, *out.parents):  # the nearest that exists must be a folder
        if folder.exists():
            if not folder.is_dir():
                raise StoreError(f"--out: {folder} is {_what(folder)}, not a folder")
            break
    for target in targets:
        if os.path.lexists(target) and not target.is_file():
            raise StoreError(f"--out: {target} is {_what(target)}, where the export writes a "
                             f"file of its own; move it")


def _what(path: Path) -> str:
    try:
        return kind(os.stat(path).st_mode) if not path.is_file() else "a file"
    except OSError:
        return "a broken link"
