"""A deployment's home (``--home``) is fedlm's own folder: one it made (its marker in it),
a new one, or an empty one adopted. A folder of the user's is refused in one line before
anything is written, and inside its own home fedlm replaces only what it makes
(fedlm.deploy.home, fedlm.deploy.bundle.check_restageable)."""

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedlm import config_load
from fedlm.deploy import bundle, home as home_lib
from fedlm.deploy.credentials import private_home
from fedlm.deploy.local import LocalDeployment
from fedlm.deploy.run_local import check_config
from fedlm.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _snapshot(folder: Path) -> dict[str, tuple]:
    """Every path under ``folder`` (itself included): its kind and mode, a file's bytes."""
    out = {}
    for path in [folder, *sorted(folder.rglob("*"))]:
        st = os.lstat(path)
        body = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
        out[str(path.relative_to(folder))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                              body)
    return out


def _users_project(path: Path) -> Path:
    """The issue's folder: an app of the user's, a config.toml, a SuperLink backup."""
    (path / "app" / "src").mkdir(parents=True)
    (path / "app" / "src" / "main.py").write_text("print('mine')\n")
    (path / "config.toml").write_text("[mine]\nx = 1\n")
    (path / "superlink.db.backup").write_bytes(b"SQLite format 3\x00 backup")
    path.chmod(0o755)
    return path


def _one_line_refusal(home: Path, match: str) -> str:
    with pytest.raises(ConfigError, match=match) as info:
        home_lib.prepare(home)
    text = str(info.value)
    assert "\n" not in text and str(home) in text
    return text


# -- what is made, reused and adopted --------------------------------------------------
def test_a_new_home_is_made_private_with_the_marker_and_reused(tmp_path):
    home = tmp_path / "runs" / "deploy"  # its parents made too, as for the default home
    assert home_lib.check(home) == "make"
    private_home(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    marker = home / home_lib.MARKER
    assert marker.read_text().startswith(home_lib.MARKER_HEAD)
    assert stat.S_IMODE(marker.stat().st_mode) == 0o600
    (home / "keys").mkdir()
    (home / "superlink.log").write_text("log")
    assert home_lib.check(home) == "reuse"
    home.chmod(0o750)
    private_home(home)  # made private again
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_an_empty_folder_is_adopted(tmp_path):
    home = tmp_path / "empty"
    home.mkdir(mode=0o755)
    assert home_lib.check(home) == "adopt"
    private_home(home)
    assert (home / home_lib.MARKER).is_file() and stat.S_IMODE(home.stat().st_mode) == 0o700


def test_a_home_of_an_earlier_fedlm_without_the_marker_is_adopted(tmp_path):
    """The default runs/deploy of a fedlm from before the marker keeps working."""
    home = tmp_path / "deploy"
    (home / "keys").mkdir(parents=True)
    (home / "certs").mkdir()
    (home / "keys" / "control.token").write_text("t\n")
    (home / "config.toml").write_text('[superlink]\ndefault = "fedlm-local"\n\n'
                                      '[superlink.fedlm-local]\naddress = "127.0.0.1:1"\n')
    for name in ("superlink.log", "supernode0.log", "run-id", "source"):
        (home / name).write_text("x")
    assert home_lib.check(home) == "adopt"
    private_home(home)
    assert home_lib.check(home) == "reuse"
    (home / "notes.txt").write_text("mine")  # fedlm's home still, with a file of the user's
    assert home_lib.check(home) == "reuse"


def test_a_folder_with_fedlms_names_but_not_its_connection_is_refused(tmp_path):
    home = tmp_path / "lookalike"
    (home / "keys").mkdir(parents=True)
    (home / "config.toml").write_text("[superlink]\n")  # not fedlm's connection
    _one_line_refusal(home, "fedlm did not make it")


# -- a folder of the user's, and hostile paths -----------------------------------------
def test_a_users_folder_is_refused_and_left_as_it_was(tmp_path):
    home = _users_project(tmp_path / "project")
    before = _snapshot(home)
    text = _one_line_refusal(home, "not empty and fedlm did not make it")
    assert "give a new or empty folder" in text
    assert _snapshot(home) == before


@pytest.mark.parametrize("kind", ["file", "fifo", "link to a folder", "link to nothing"])
def test_a_home_that_is_not_a_folder_is_refused_without_opening_it(tmp_path, kind):
    home, theirs = tmp_path / "home", tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    if kind == "file":
        home.write_text("mine")
    elif kind == "fifo":
        os.mkfifo(home)  # an open would wait for a writer for ever
    else:
        home.symlink_to(theirs if kind == "link to a folder" else tmp_path / "nowhere")
    before = _snapshot(tmp_path)
    _one_line_refusal(home, {"file": "is a file, not a folder", "fifo": "is a FIFO",
                             }.get(kind, "is a link"))
    assert _snapshot(tmp_path) == before


def test_a_home_under_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("mine")
    _one_line_refusal(tmp_path / "afile" / "home", "afile is a file, not a folder")


def test_an_unwritable_folder_is_refused_and_keeps_its_mode(tmp_path):
    home = tmp_path / "readonly"
    home.mkdir()
    home.chmod(0o500)
    try:
        _one_line_refusal(home, r"not writable by you \(mode 0500\)")
        assert stat.S_IMODE(home.stat().st_mode) == 0o500 and not list(home.iterdir())
    finally:
        home.chmod(0o700)


def test_a_shared_folder_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    _one_line_refusal(shared, "a shared folder")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


@pytest.mark.parametrize("kind", ["folder", "fifo", "link", "foreign file"])
def test_a_marker_that_is_not_fedlms_file_is_refused_without_reading_it(tmp_path, kind):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    marker = home / home_lib.MARKER
    if kind == "folder":
        marker.mkdir()
    elif kind == "fifo":
        os.mkfifo(marker)  # a read would wait for a writer for ever
    elif kind == "link":
        (tmp_path / "real").write_text(home_lib.MARKER_TEXT)
        marker.symlink_to(tmp_path / "real")
    else:
        marker.write_text("something else\n")
    (home / "mine.txt").write_text("mine")
    before = _snapshot(home)
    started = time.monotonic()
    _one_line_refusal(home, "not fedlm's marker")
    assert time.monotonic() - started < 5
    assert _snapshot(home) == before


@pytest.mark.parametrize("name,kind", [("config.toml", "fifo"), ("superlink.log", "fifo"),
                                       ("credentials.yaml", "link"), ("keys", "link"),
                                       ("app", "file"), ("certs", "file")])
def test_fedlms_own_names_of_another_kind_are_refused_not_written_through(
        tmp_path, name, kind):
    home = tmp_path / "home"
    private_home(home)
    target, theirs = home / name, tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "id_ecdsa").write_text("a key of the user's")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "link":
        target.symlink_to(theirs if name == "keys" else theirs / "id_ecdsa")
    else:
        target.write_text("mine")
    before = _snapshot(tmp_path)
    _one_line_refusal(home, f"{name} is a ")
    assert _snapshot(tmp_path) == before


def test_in_its_own_home_fedlm_replaces_only_what_it_made(tmp_path):
    """A user's files beside fedlm's are left alone: a superlink.db.backup is not one of
    SQLite's files; a file in app/ (made anew at each run) is named, not deleted."""
    home = tmp_path / "home"
    private_home(home)
    (home / "superlink.db.backup").write_bytes(b"backup")
    (home / "notes.txt").write_text("mine")
    bundle.stage(ROOT, home / "app", home=home)  # an earlier run's bundle
    assert home_lib.check(home) == "reuse"
    bundle.stage(ROOT, home / "app", home=home)  # replaced: it has a bundle's shape
    mine = home / "app" / "fedlm" / "notes.md"
    mine.write_text("mine")
    before = _snapshot(home)
    _one_line_refusal(home, "notes.md is not a file of fedlm's app bundle")
    with pytest.raises(ConfigError, match="notes.md is not a file of fedlm's app bundle"):
        bundle.stage(ROOT, home / "app", home=home)
    assert _snapshot(home) == before
    from fedlm.deploy.local import LINK_DB_FILES
    assert "superlink.db.backup" not in LINK_DB_FILES


@pytest.mark.parametrize("stray", ["fifo", "link", "top-level file"])
def test_a_bundle_folder_with_a_stray_is_not_removed(tmp_path, stray):
    app = tmp_path / "app"
    (app / "fedlm").mkdir(parents=True)
    (app / "fedlm" / "x.py").write_text("x = 1\n")
    path = {"fifo": app / "fedlm" / "y.py", "link": app / "strategies",
            "top-level file": app / "README.md"}[stray]
    if stray == "fifo":
        os.mkfifo(path)
    elif stray == "link":
        path.symlink_to(tmp_path)
    else:
        path.write_text("mine")
    with pytest.raises(ConfigError, match=str(path)):
        bundle.check_restageable(app)
    assert os.path.lexists(path) and (app / "fedlm" / "x.py").exists()


def test_a_home_of_another_user_writes_nothing(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to make a folder of another user")
    home = tmp_path / "theirs"
    home.mkdir(mode=0o755)
    os.chown(home, 65534, 65534)
    _one_line_refusal(home, "not yours")
    assert stat.S_IMODE(home.stat().st_mode) == 0o755 and not list(home.iterdir())


def test_start_refuses_a_users_folder_before_anything_starts(tmp_path):
    home = _users_project(tmp_path / "project")
    before = _snapshot(home)
    dep = LocalDeployment(home, 1)
    with pytest.raises(ConfigError, match="fedlm did not make it"):
        dep.start(config_load.load(None, ["model=tiny", "workers=1"]))
    assert dep.procs == [] and _snapshot(home) == before


def test_batched_training_is_refused_under_deploy():
    with pytest.raises(ConfigError, match="sim.batched: 'on'"):
        check_config(config_load.load(None, ["model=tiny", "sim.batched=on"]))
    check_config(config_load.load(None, ["model=tiny", "sim.batched=auto"]))


# -- the command a user runs ---------------------------------------------------------------
@pytest.mark.parametrize("extra,match", [([], "not empty and fedlm did not make it"),
                                         (["--set", "sim.batched=on"], "sim.batched")])
def test_deploy_local_on_a_users_folder_fails_fast_and_touches_nothing(tmp_path, extra, match):
    home, db = _users_project(tmp_path / "project"), tmp_path / "runs.db"
    before = _snapshot(home)
    proc = subprocess.run(
        [sys.executable, "-m", "fedlm", "deploy", "local", "--workers", "2", "--set",
         "model=tiny", "--set", "updates=1", "--home", str(home), "--db", str(db), *extra],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedlm: error: ") and match in lines[0], \
        proc.stderr
    assert "SuperLink" not in proc.stdout + proc.stderr  # refused before anything started
    assert _snapshot(home) == before and not db.exists()
