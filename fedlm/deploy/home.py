"""The folder a local deployment keeps its files in (``--home``, Flower's FLWR_HOME): fedlm's.

A home holds the deployment's private keys, its Control API token, its logs and a copy
of the project's code, and fedlm replaces those at every start. So it must never be a
folder of the user's: fedlm writes a marker, ``.fedlm-deploy-home``, into a home it
makes, and ``prepare`` takes only

- a path that does not exist yet: made (mode 0700) with the marker in it;
- an empty folder of the user's own: adopted (the marker written, mode 0700);
- a folder with the marker: reused, as fedlm made it earlier;
- a folder an earlier fedlm made before there was a marker (every entry one fedlm or
  Flower makes, ``config.toml`` naming fedlm's connection): adopted.

Anything else is refused in one line, before anything is written (``check`` reads only):
a non-empty folder without the marker, a file, a FIFO, a link (even to a folder), a
folder of another user or a shared one (sticky, as /tmp), one without write permission,
a marker that is not fedlm's regular file (a folder or a FIFO is never opened).

Inside its home fedlm writes only the names below (``DIRS``, ``FILES``, ``LOGS``) and Flower,
run with FLWR_HOME there, only its own (``FLOWER_DIRS``, ``FLOWER_FILES``); any other file
the user puts there is left alone. Where fedlm would write through something it did not
make (a link or a FIFO at one of its names, a file of the user's in ``app/``, which is
made anew at every run), the start is refused and the path named instead.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from fedlm.deploy import bundle
from fedlm.errors import ConfigError

MARKER = ".fedlm-deploy-home"
MARKER_HEAD = "fedlm deploy home"  # the marker's first words: a file of that name is fedlm's
MARKER_TEXT = (f"{MARKER_HEAD}: made by `fedlm deploy local`, which replaces what it makes "
               f"here (app/, certs/, keys/, config.toml, credentials.yaml, run-config.toml, "
               f"run-id, superlink.db, the logs) at every start and leaves other files alone.\n")

DIRS = ("app", "certs", "keys")  # fedlm's folders: the bundle, TLS files, keys and secrets
FILES = ("config.toml", "credentials.yaml", "run-config.toml", "run-id", "superlink.db",
         "superlink.db-wal", "superlink.db-shm", "superlink.db-journal")
LOGS = re.compile(r"(superlink|flwr-run|supernode\d+)\.log")  # the processes `deploy` starts
# What Flower 1.41, 1.42 write under FLWR_HOME: installed apps, the telemetry id, the
# update-check cache, runtime environments, `flwr run`'s local SuperLink, app reviews
FLOWER_DIRS = ("apps", ".cache", "runtime-envs", "local-superlink", "reviews")
FLOWER_FILES = ("source",)
CONNECTION_HEAD = "[superlink.fedlm-local]"  # in the config.toml of an earlier fedlm's home
READ_AT_MOST = 4096  # of a marker or an old config.toml: enough for its first line


def check(home: Path) -> str:
    """What ``prepare`` will do with ``home``: ``"make"`` (nothing there yet), ``"adopt"``
    (an empty folder, or an earlier fedlm's without the marker) or ``"reuse"`` (fedlm's).
    Any other path raises ConfigError in one line naming it. Nothing is written, and no
    file other than a regular one is opened."""
    st = _lstat(home, missing_ok=True)
    if st is None:
        _check_makeable(home)
        return "make"
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"deploy: --home {home} is a link (to {os.readlink(home)}); "
                          f"give a new folder, or one fedlm made before")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"deploy: --home {home} is {_kind(st)}, not a folder; "
                          f"give a new folder, or one fedlm made before")
    if st.st_uid != os.getuid() or st.st_mode & stat.S_ISVTX:
        why = "not yours" if st.st_uid != os.getuid() else "a shared folder"
        raise ConfigError(f"deploy: {home} is {why}; --home needs a folder of your own "
                          f"(it holds the deployment's keys and token)")
    if st.st_mode & stat.S_IRWXU != stat.S_IRWXU:  # by its mode, even for root
        raise ConfigError(f"deploy: --home {home} is not writable by you (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}); fedlm writes the deployment's "
                          f"keys and logs there: give another folder")
    if _lstat(home / MARKER, missing_ok=True) is not None:
        _check_marker(home / MARKER)
        _check_contents(home, _names(home))
        return "reuse"
    names = _names(home, stop_at_foreign=True)  # a big folder of the user's: not listed whole
    if not names:
        return "adopt"
    if _made_by_earlier_fedlm(home, names):
        _check_contents(home, names)
        return "adopt"
    raise ConfigError(f"deploy: --home {home} is not empty and fedlm did not make it (no "
                      f"{MARKER} in it); fedlm would write its keys, logs and app/ there: "
                      f"give a new or empty folder")


def prepare(home: Path) -> None:
    """Make, adopt or reuse ``home`` as ``check`` says (else its one-line ConfigError):
    mode 0700 (it holds private keys and the Control API token), the marker in it."""
    what = check(home)
    if what == "make":
        try:
            home.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(home, 0o700)
        except FileExistsError:  # made meanwhile, by someone else: judged as it is now
            what = check(home)
        except OSError as exc:
            raise ConfigError(f"deploy: cannot make --home {home} ({exc.strerror})") from None
    os.chmod(home, 0o700)  # a folder, not a link: check() says so
    if what != "reuse":
        try:
            fd = os.open(home / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o600)
        except FileExistsError:  # written meanwhile: judged as it is now
            check(home)
            return
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(MARKER_TEXT)


def _check_makeable(home: Path) -> None:
    """The nearest existing folder above ``home`` is one that ``mkdir`` can make it in."""
    for above in home.parents:
        try:
            st = os.stat(above)  # a link to a folder above is a folder
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise ConfigError(f"deploy: cannot make --home {home}: {above} cannot be "
                              f"examined ({exc.strerror})") from None
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"deploy: cannot make --home {home}: {above} is {_kind(st)}, "
                              f"not a folder")
        if not os.access(above, os.W_OK | os.X_OK):
            raise ConfigError(f"deploy: cannot make --home {home}: {above} is not writable "
                              f"by you")
        return


def _names(home: Path, stop_at_foreign: bool = False) -> list[str]:
    """The names in ``home``, sorted; with ``stop_at_foreign``, up to the first that is
    not one fedlm or Flower writes (enough to tell a folder of the user's)."""
    names = []
    try:
        with os.scandir(home) as entries:
            for entry in entries:
                names.append(entry.name)
                if stop_at_foreign and not _known(entry.name):
                    break
    except OSError as exc:
        raise ConfigError(f"deploy: --home {home} cannot be listed ({exc.strerror})") from None
    return sorted(names)


def _known(name: str) -> bool:
    """A name fedlm or Flower writes in a home."""
    return (name in DIRS or name in FILES or name in FLOWER_DIRS or name in FLOWER_FILES
            or LOGS.fullmatch(name) is not None)


def _check_marker(path: Path) -> None:
    st = _lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"deploy: {path} is {_kind(st)}, not fedlm's marker file; remove "
                          f"it, or give another --home")
    if not _head(path).startswith(MARKER_HEAD):
        raise ConfigError(f"deploy: {path} is not fedlm's marker (it does not start with "
                          f"{MARKER_HEAD!r}); remove it, or give another --home")


def _check_contents(home: Path, names: list[str]) -> None:
    """What fedlm and Flower will write to in ``home`` is of the kind they make (never a
    link or a FIFO written through); ``app/`` holds nothing but a bundle's files."""
    for name in names:
        path = home / name
        if name in DIRS or name in FLOWER_DIRS:
            want, what = stat.S_ISDIR, "a folder"
        elif name in FILES or name in FLOWER_FILES or LOGS.fullmatch(name):
            want, what = stat.S_ISREG, "a regular file"
        else:
            continue  # not a name fedlm or Flower writes: the user's, left alone
        st = _lstat(path)
        if not want(st.st_mode):
            raise ConfigError(f"deploy: {path} is {_kind(st)}, where fedlm writes {what} of "
                              f"its own; move it out of {home}")
    for name in ("certs", "keys"):  # every file in them is fedlm's, rewritten at each start
        if name in names:
            for entry in sorted(os.scandir(home / name), key=lambda e: e.name):
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise ConfigError(f"deploy: {entry.path} is {_kind(st)}, where fedlm "
                                      f"keeps its keys and certificates as regular files; "
                                      f"move it out of {home}")
    if "app" in names:
        bundle.check_restageable(home / "app")


def _made_by_earlier_fedlm(home: Path, names: list[str]) -> bool:
    """A home an earlier fedlm made, before the marker (the default ``runs/deploy`` of an
    earlier version): every entry a name fedlm or Flower writes, ``keys/`` among them,
    and a ``config.toml`` (a regular file) that holds fedlm's connection."""
    if "keys" not in names or not all(map(_known, names)):
        return False
    config = home / "config.toml"
    st = _lstat(config, missing_ok=True)
    return st is not None and stat.S_ISREG(st.st_mode) and CONNECTION_HEAD in _head(config)


def _head(path: Path) -> str:
    """The first ``READ_AT_MOST`` bytes of a regular file as text; never blocks (a FIFO
    put there since the ``lstat`` opens without waiting for a writer, and is not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"deploy: {path} cannot be read ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, READ_AT_MOST).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _lstat(path: Path, missing_ok: bool = False) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a file above it
        if missing_ok:
            return None
        raise ConfigError(f"deploy: {path} vanished while fedlm looked at it") from None
    except OSError as exc:
        raise ConfigError(f"deploy: {path} cannot be examined ({exc.strerror})") from None


def _kind(st: os.stat_result) -> str:
    mode = st.st_mode
    for test, name in ((stat.S_ISLNK, "a link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISREG, "a file")):
        if test(mode):
            return name
    return "not a file or a folder"
