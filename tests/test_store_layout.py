"""All SQL lives in fedlm/store/: no other module of fedlm, the dashboard or the
experiments' scripts holds an SQL statement in a string (benchmarks under
experiments/bench/ measure the store itself and may). And the store package
keeps the names its callers import."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# An SQL statement, not an English word that happens to be a keyword: the
# keyword in capitals, followed by what SQL puts after it.
SQL = re.compile(
    r"\bSELECT\s+(?:DISTINCT\s+)?(?:\*|\w+\s*[(.,]|\w+\s+(?:AS\s+\w+\s*)?(?:,|FROM\b)|\d\b)"
    r"|\bSELECT\b.*\bFROM\s+\w+"
    r"|\bINSERT\s+(?:OR\s+\w+\s+)?INTO\b"
    r"|\bUPDATE\s+\w+\s+SET\b"
    r"|\bDELETE\s+FROM\b"
    r"|\bCREATE\s+(?:UNIQUE\s+)?(?:TABLE|INDEX|VIEW|TRIGGER)\b"
    r"|\b(?:ALTER|DROP)\s+(?:TABLE|INDEX|VIEW)\b"
    r"|\bPRAGMA\s+\w+"
    r"|\bBEGIN\s+(?:IMMEDIATE|EXCLUSIVE|DEFERRED|TRANSACTION)\b",
    re.DOTALL)


def sql_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in ``path`` that holds SQL; adjacent
    literals count as one string, and f-strings by their literal parts."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if SQL.search(text):
            found.append((node.lineno, " ".join(text.split())[:80]))
    return found


def outside_the_store() -> list[Path]:
    files = [*(ROOT / "fedlm").rglob("*.py"), *(ROOT / "dashboard").rglob("*.py"),
             *(ROOT / "experiments").glob("*.py")]
    store = ROOT / "fedlm" / "store"
    return sorted(f for f in files if store not in f.parents)


def test_no_sql_outside_the_store():
    offenders = [f"{f.relative_to(ROOT)}:{line}: {text}"
                 for f in outside_the_store() for line, text in sql_strings(f)]
    assert not offenders, "SQL outside fedlm/store/:\n" + "\n".join(offenders)


def test_the_check_sees_the_stores_own_sql():
    """The pattern finds every kind of statement the store writes (so the check
    above is not vacuous) and skips prose that only uses the words."""
    store = ROOT / "fedlm" / "store"
    texts = " ".join(t for f in store.glob("*.py") for _, t in sql_strings(f))
    for keyword in ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "PRAGMA",
                    "BEGIN"):
        assert keyword in texts, keyword
    assert len(sql_strings(store / "readers.py")) >= 10
    for prose in ("Select the runs to compare", "an update from a worker",
                  "delete its states of older jobs", "create the folder first",
                  "# pragma: no cover", "SELECT a run in the sidebar"):
        assert not SQL.search(prose), prose


def test_every_module_of_the_store_is_documented_and_short():
    for f in (ROOT / "fedlm" / "store").glob("*.py"):
        assert ast.get_docstring(ast.parse(f.read_text())), f.name
        assert len(f.read_text().splitlines()) <= 400, f.name


def test_callers_import_the_store_as_before():
    from fedlm import store

    for name in ("RunWriter", "StoreError", "IntervalKind", "SCHEMA_VERSION", "TABLES",
                 "RunSummary", "WorkerSummary", "Troubles", "connect", "connect_readonly",
                 "check_writable", "db_error", "db_timeout", "transaction", "with_retries",
                 "store_id", "mark_ended", "list_runs", "summarize", "troubles", "config_of",
                 "shown_status", "last_seen", "export", "run_row", "operation_log",
                 "metric_curve", "uploaded_bytes"):
        assert hasattr(store, name), name
    assert callable(store.export)
    assert store.SCHEMA_VERSION == 7
