"""How ``fedlm dashboard`` starts the Streamlit app: the run database it will read,
checked first, and the server's command line (``fedlm.interrupts.serve`` runs it)."""

from __future__ import annotations

import sys
from pathlib import Path

from fedlm import store
from fedlm.store import StoreError

APP = Path(__file__).resolve().parent / "app.py"


def database(db: str) -> str:
    """The absolute path of the run database ``db``, once it is known to be readable
    now or creatable later: a missing one is fine (the page waits for a run to
    create it), one that can never be made is refused (``StoreError``)."""
    path = Path(db).resolve()
    if path.exists():
        store.list_runs(str(path))  # not a run database, another version: one line now
    else:
        folder = next(f for f in path.parents if f.exists())
        if not folder.is_dir():
            raise StoreError(f"db: no run database can be made at {db}: "
                             f"{folder} is a file, not a folder")
    return str(path)


def command(db: str, host: str, port: int) -> list[str]:
    """The Streamlit server's command line: the app on ``host:port``, reading ``db``."""
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless=true",
            f"--server.port={port}", f"--server.address={host}",
            "--browser.gatherUsageStats=false", "--", "--db", db]
