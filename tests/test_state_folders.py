"""``fedlm states``: the workers' state folders on this machine, judged by their runs
(fedlm.worker.state_folders). A folder a resume can use is kept, whatever --clean
says; one no run can use is removed; one of unknown owner only when old enough; and
nothing outside the folder of state folders is touched."""

import json
import os
import shutil
import time

import pytest

from fedlm.checkpoint import folder_for
from fedlm.cli import main
from fedlm.engine import Interrupted
from fedlm.runner import run_inprocess
from fedlm.store import connect_readonly
from fedlm.worker import state_folders
from tests.conftest import tiny_config

DISK = ("reliability.checkpoint_every=2", "updates=6")  # disk states, checkpoints


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The state folders under this test's own folder (the corpus cache stays shared)."""
    monkeypatch.setattr("fedlm.worker.states.cache_dir", lambda: tmp_path / "cache")
    return tmp_path / "cache" / "worker-state"


def _stopped_run(db, seen=None) -> None:
    """A run stopped after 3 updates (a checkpoint at 2), its states kept."""
    stop = []

    def progress(p):
        if seen is not None and p.version == 1 and not seen:
            seen.extend(state_folders.survey())  # while it runs
        if p.version >= 3:
            stop.append(1)

    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*DISK), str(db), should_stop=lambda: bool(stop),
                      progress=progress)


def _folder(cache, name: str, owner=None, days_idle: float = 0.0):
    path = cache / name
    (path / "worker0").mkdir(parents=True)
    (path / "worker0" / "job1.pt").write_bytes(b"x" * 1000)
    if owner is not None:
        (path / state_folders.OWNER).write_text(owner)
    then = time.time() - days_idle * 86400
    for p in [path / "worker0" / "job1.pt", path / "worker0", path,
              *([path / state_folders.OWNER] if owner is not None else [])]:
        os.utime(p, (then, then))
    return path


def _verdicts() -> dict:
    return {f.path.name: (f.removable, f.why) for f in state_folders.survey()}


def test_a_folder_a_resume_can_use_is_kept_and_the_rest_go(cache, tmp_path, capsys):
    seen = []
    _stopped_run(tmp_path / "a.db", seen)  # run 1: stopped with a checkpoint
    assert [f.why for f in seen] == ["its run is running"] and not seen[0].removable
    _stopped_run(tmp_path / "b.db")  # stopped, then its checkpoints lost
    shutil.rmtree(folder_for(tmp_path / "b.db", 1))
    finished = tmp_path / "c.db"
    run_inprocess(tiny_config(*DISK), str(finished))  # finished: its folder went with it
    kept_a, lost_b = sorted(cache.iterdir(), key=lambda p: p.stat().st_mtime)
    _folder(cache, "finished", json.dumps({"db": str(finished), "run_id": 1}))
    _folder(cache, "absent", json.dumps({"db": str(finished), "run_id": 7}))
    _folder(cache, "old", days_idle=10)  # no owner recorded: made by another fedlm
    _folder(cache, "garbled", "{not json", days_idle=10)
    _folder(cache, "moved", json.dumps({"db": str(tmp_path / "gone.db"), "run_id": 1}))
    _folder(cache, "halfway" + state_folders.GOING)  # a --clean killed while removing it
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    (cache / "link").symlink_to(outside)

    verdicts = _verdicts()
    assert verdicts[kept_a.name][0] is False and "--resume 1" in verdicts[kept_a.name][1]
    assert verdicts[lost_b.name] == (True, "its run interrupted with no checkpoint to "
                                           "resume from")
    # records that name a finished run, or a run its store never had: taken at face
    # value they made these folders removable; the store confirms neither
    assert verdicts["finished"] == (False, "its run never claimed this folder in its store")
    assert verdicts["absent"] == (False, "its run is not in its store")
    assert verdicts["old"][0] is False and verdicts["garbled"][0] is False
    assert verdicts["halfway" + state_folders.GOING] == (True, "its removal was interrupted")
    assert verdicts["moved"][0] is False
    assert verdicts["moved"][1].startswith("its store is not there (moved?)")
    assert "link" not in verdicts

    assert main(["states"]) == 0  # a listing removes nothing
    assert "2 removable" in capsys.readouterr().out
    assert main(["states", "--clean"]) == 0
    assert "removed 2 folders" in capsys.readouterr().out
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [kept_a.name, "finished", "absent", "old", "garbled", "moved", "link"])
    assert main(["states", "--clean", "--older-than", "7"]) == 0  # unknown owners, if old
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [kept_a.name, "finished", "absent", "moved", "link"])
    assert (outside / "precious").read_text() == "keep"

    run_inprocess(tiny_config(*DISK), str(tmp_path / "a.db"), resume=1)  # its states served
    with connect_readonly(tmp_path / "a.db") as conn:
        assert conn.execute("SELECT status FROM runs").fetchone()[0] == "finished"
    assert sorted(p.name for p in cache.iterdir()) == ["absent", "finished", "link", "moved"]


def test_with_nothing_there_it_says_so(cache, capsys):
    assert main(["states", "--clean"]) == 0
    assert capsys.readouterr().out.startswith("no worker-state folders in ")


def test_a_root_that_is_a_link_is_refused_and_nothing_behind_it_goes(cache, tmp_path, capsys):
    """``<cache>/worker-state`` itself a link: its targets are not ours to judge."""
    elsewhere = tmp_path / "elsewhere"
    _folder(elsewhere, "old", days_idle=30)  # would be removable with --older-than 7
    (elsewhere / "old" / "precious").write_text("keep")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.symlink_to(elsewhere)
    assert main(["states", "--clean", "--older-than", "7"]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a link" in err and "\n" not in err
    assert (elsewhere / "old" / "precious").read_text() == "keep"


def test_a_resume_whose_states_were_cleaned_is_refused_in_one_line_and_changes_nothing(
        cache, tmp_path, capsys):
    """Its checkpoint needs the workers' states: without them the resume once failed job
    after job (MissingState); now it is refused before the store is touched, and the
    run stays as it was (interrupted)."""
    db = tmp_path / "a.db"
    _stopped_run(db)
    for folder in cache.iterdir():
        shutil.rmtree(folder)
    with connect_readonly(db) as conn:
        before = conn.execute("SELECT COUNT(*) FROM updates").fetchone()[0]
    assert main(["run", "--resume", "1", "--db", str(db), "--backend", "inprocess"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar
    assert "fedlm: error: --resume: run 1's worker states are gone from" in err
    with connect_readonly(db) as conn:
        assert conn.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
        assert conn.execute("SELECT COUNT(*) FROM updates").fetchone()[0] == before
