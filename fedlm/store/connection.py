"""Opening the run database: writers, read-only readers, retries, one-line errors.

SQLite has one write lock per file. A writer never keeps a transaction open: it
writes in short ``BEGIN IMMEDIATE`` transactions (``transaction``), tried again
with jittered exponential back-off while another writer holds the lock
(``with_retries``), ``FEDLM_DB_TIMEOUT`` seconds in all (``db_timeout``). The
file is in WAL mode, so readers (``connect_readonly``, ``mode=ro``) go on while
a writer commits. Whatever goes wrong with the file becomes one ``StoreError``
line naming it (``db_error``).
"""

from __future__ import annotations

import errno
import os
import random
import sqlite3
import stat
import time
from contextlib import closing
from pathlib import Path
from typing import Callable, TypeVar

from fedlm import files
from fedlm.store import schema

T = TypeVar("T")

# One attempt waits at most this long for the write lock (SQLite's own busy
# handler); ``with_retries`` backs off and tries again until ``db_timeout()``.
_ATTEMPT_WAIT = 1.0


class StoreError(RuntimeError):
    """The run database cannot be used (the message says why)."""


def db_timeout() -> float:
    """Seconds to wait on a database another connection holds locked before giving
    up: ``FEDLM_DB_TIMEOUT``, default 30."""
    try:
        seconds = float(os.environ.get("FEDLM_DB_TIMEOUT", "30"))
    except ValueError:
        return 30.0
    return seconds if 0 <= seconds <= 86400 else 30.0


def _is_busy(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def with_retries(action: Callable[[], T]) -> T:
    """``action()``, a short write, tried again with jittered exponential back-off
    while another connection holds the database locked, for ``db_timeout()``
    seconds in all; then the last error is raised."""
    deadline = time.monotonic() + db_timeout()
    delay = 0.01
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            left = deadline - time.monotonic()
            if not _is_busy(exc) or left <= 0:
                raise
        time.sleep(min(left, delay * random.uniform(0.5, 1.5)))
        delay = min(delay * 2, 1.0)


def transaction(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """``work(conn)`` inside one ``BEGIN IMMEDIATE`` transaction (the write lock is
    taken first, so it cannot fail half-way for want of it), with retries."""
    def attempt() -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = work(conn)
            conn.execute("COMMIT")
            return result
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return with_retries(attempt)


def writer_connection(path: Path) -> sqlite3.Connection:
    """A bare writer connection to an existing store (no schema check)."""
    # isolation_level=None: no implicit transactions; every write goes through
    # ``transaction`` (or is a single autocommitted statement).
    return sqlite3.connect(path, timeout=min(db_timeout(), _ATTEMPT_WAIT), isolation_level=None,
                           check_same_thread=False)


# The files SQLite opens beside a run database (its write-ahead log, its shared-memory
# index, a rollback journal): each, where it exists, must be a regular file too.
SIDE_FILES = ("-wal", "-shm", "-journal")


def require_regular(path: str | Path) -> None:
    """``StoreError`` in one line unless the run database ``path``, where it exists, and
    each of its side files that exists are regular files. SQLite opens them itself, and a
    FIFO there blocks its open or its reads for ever, deaf to Ctrl-C; a device feeds it."""
    for name, what in ((str(path), "a run database"),
                       *((f"{path}{side}", f"a run database's {side[1:]} file")
                         for side in SIDE_FILES)):
        if not os.path.exists(name):
            continue
        mode = os.stat(name).st_mode
        if not stat.S_ISREG(mode):
            raise StoreError(f"db: {_where(name)} is {files.kind(mode)}, not {what}")


def connect(path: str | Path) -> sqlite3.Connection:
    """A writer connection; creates the file and schema, or migrates an older
    schema, if needed. Many processes may do this at once."""
    path = Path(path)
    require_regular(path)
    for folder in path.parents:  # the nearest that exists must be a folder
        if folder.exists():
            if not folder.is_dir():
                raise StoreError(f"db: cannot create {_where(path)}: {_where(folder)} is a "
                                 f"file, not a folder")
            break
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        _create(path)
    conn = writer_connection(path)
    try:
        with_retries(lambda: conn.execute("PRAGMA journal_mode=WAL"))
        conn.execute("PRAGMA synchronous=NORMAL")
        transaction(conn, lambda c: _create_or_migrate(c, path))
    except BaseException:
        conn.close()
        raise
    return conn


def _create(path: Path) -> None:
    """Make a new store under another name and link it into place whole, so that no
    reader ever opens ``path`` half-made (no tables yet). If another process links
    its store first, that one is used."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{time.monotonic_ns()}.creating")
    try:
        try:
            with closing(writer_connection(tmp)) as conn:
                conn.execute("PRAGMA journal_mode=WAL")  # kept in the file's header
                transaction(conn, lambda c: _create_or_migrate(c, tmp))
                _fold_log(conn)
        except (sqlite3.Error, OSError) as exc:
            text = (str(exc).splitlines() or ["?"])[0]
            why = ("the disk is full or the file cannot grow" if _out_of_room(exc, text)
                   else "SQLite refused it")  # e.g. a statement of the schema it cannot run
            raise StoreError(f"db: cannot create {_where(path)}: {why} ({text}); nothing "
                             f"was made") from None
        try:
            os.link(tmp, path)  # never replaces an existing file
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: made in place, as before
            pass
    finally:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            leftover.unlink(missing_ok=True)


def _out_of_room(exc: BaseException, text: str) -> bool:
    """Whether an error while making a store says the disk (or the file) is full: SQLite's
    "database or disk is full" and I/O errors, a write-ahead log that could not be folded
    in (``_fold_log``), or the OS's ENOSPC, EDQUOT, EFBIG."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return True
    return any(sign in text for sign in ("full", "disk I/O", "not folded"))


def _fold_log(conn: sqlite3.Connection) -> None:
    """Copy the new store's write-ahead log into its file, and say so, before the file
    is linked into place: the log is deleted with the temporary name, and SQLite's
    close folds it in silently, so a close that cannot (the disk full) would leave
    a file of half its pages, malformed, under ``path``."""
    busy, log_frames, folded = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy or log_frames != folded:
        raise sqlite3.OperationalError(f"write-ahead log not folded into the file "
                                       f"({folded} of {log_frames} pages)")


def _create_or_migrate(conn: sqlite3.Connection, path: Path) -> None:
    held = schema.create_or_migrate(conn)
    if held is not None:
        raise StoreError(f"db: {_where(path)} holds schema version {held}, this fedlm "
                         f"writes version {schema.SCHEMA_VERSION}; use another --db")


def connect_readonly(path: str | Path) -> sqlite3.Connection:
    """A reader that never blocks (nor is blocked by) the writer.

    Refuses with a one-line ``StoreError`` a file that is not a fedlm run database
    or holds another schema version; an older version that ``connect`` migrates is
    upgraded in place first (the only write a reader makes)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no run database at {path}")
    require_regular(p)
    for attempt in (1, 2):
        conn = sqlite3.connect(_reader_uri(p), uri=True, timeout=db_timeout(),
                               check_same_thread=False)
        conn.row_factory = sqlite3.Row
        try:
            version = schema.schema_version(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise db_error(path, exc) from None
        if version == str(schema.SCHEMA_VERSION):
            return conn
        conn.close()
        if version is None:
            raise StoreError(f"db: {_where(path)} is not a fedlm run database (no schema version)")
        if attempt == 1 and schema.can_migrate(version):
            try:
                connect(p).close()  # the writer's migration, then read
            except (sqlite3.Error, OSError) as exc:
                raise StoreError(f"db: {_where(path)} holds schema version {version} and cannot "
                                 f"be upgraded to {schema.SCHEMA_VERSION}: "
                                 f"{db_error(path, exc)}") from None
            continue
        break
    raise StoreError(f"db: {_where(path)} holds schema version {version}, this fedlm reads "
                     f"version {schema.SCHEMA_VERSION} (another fedlm wrote it); use that fedlm "
                     f"or another --db")


def _reader_uri(path: Path) -> str:
    """The URI a reader opens ``path`` by: read-only; and immutable where its folder
    cannot be written (a read-only file system or mount). A reader of a WAL file
    makes the ``-shm`` file beside it, which it cannot there ("unable to open
    database file"); and no writer can be at work there either (it could not make
    its ``-wal``), so the file is read as it stands."""
    path = path.resolve()
    uri = f"{path.as_uri()}?mode=ro"
    return uri if os.access(path.parent, os.W_OK) else f"{uri}&immutable=1"


def check_writable(db: str) -> None:
    """Open the run database as a run will, now: a file of another schema version,
    not SQLite, a directory or locked past FEDLM_DB_TIMEOUT fails in one line (an
    older version is migrated, as by the run). ``fedlm run`` and ``fedlm sweep``
    call it before any library loads or worker starts."""
    require_regular(db)
    if Path(db).is_file() and Path(db).stat().st_size > 0:  # not another program's SQLite
        try:
            with closing(sqlite3.connect(f"{Path(db).resolve().as_uri()}?mode=ro", uri=True,
                                         timeout=db_timeout())) as conn:
                tables = schema.table_names(conn)
                version = schema.schema_version(conn) if "meta" in tables else None
        except sqlite3.Error as exc:
            raise db_error(db, exc) from None
        if tables and "meta" not in tables:
            raise StoreError(f"db: {db} is a SQLite database of something else (no fedlm "
                             f"meta table); use another --db")
        if version is not None and not str(version).isdigit():
            raise StoreError(f"db: {db} holds schema version {version}, this fedlm writes "
                             f"version {schema.SCHEMA_VERSION}; use another --db")
    try:
        connect(db).close()
    except StoreError:
        raise
    except (sqlite3.Error, OSError, ValueError) as exc:
        raise db_error(db, exc) from None


def _where(path: str | Path) -> str:
    text = str(path)
    return text if text.isprintable() else repr(text)


def db_error(path: str | Path, exc: BaseException) -> StoreError:
    """A one-line ``StoreError`` for an sqlite3 (or OS) error on the run database ``path``."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    where = _where(path)
    if isinstance(exc, StoreError):
        return exc
    if "file is not a database" in text:
        return StoreError(f"db: {where} is not a SQLite database")
    if "locked" in text or "busy" in text:
        return StoreError(f"db: {where} is locked by another process (gave up after "
                          f"{db_timeout():g} s; FEDLM_DB_TIMEOUT sets the wait)")
    if "no such table" in text or "no such column" in text:
        return StoreError(f"db: {where} is not a fedlm run database ({text})")
    if "malformed" in text:
        return StoreError(f"db: {where} is damaged ({text})")
    if "unable to open" in text:
        return StoreError(f"db: cannot open {where} ({text})")
    if isinstance(exc, OSError) and exc.strerror:
        return StoreError(f"db: cannot use {where}: {exc.strerror}")
    return StoreError(f"db: {where}: {text}")
