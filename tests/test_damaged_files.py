"""Damaged local files end in one line, never a traceback, and nothing of the user's is
lost: a damaged row of the run store is listed as damaged beside the others and named
(table, row, column, value) by every command that needs it; a damaged data cache is
rebuilt whole; a trace with an id no trace has is refused. And two leftovers of the
same kind: ``fedlm plan`` names the flag the user gave, and two ``fedlm states
--clean`` at the same time both end cleanly.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import sqlite3
import threading
from contextlib import closing, nullcontext
from dataclasses import replace

import numpy as np
import pytest

from fedlm import cli, data, store
from fedlm.config import DataConfig
from fedlm.errors import ConfigError
from fedlm.runner import run_inprocess
from fedlm.sim import traces
from fedlm.store import readers
from fedlm.worker import state_folders
from tests._cli import assert_refused, run_cli
from tests.conftest import tiny_config

# -- The run store: a damaged row ----------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A store of two finished runs (1 and 2), made once; each test damages a copy."""
    db = tmp_path_factory.mktemp("store") / "two.db"
    for name in ("first", "second"):
        run_inprocess(tiny_config("updates=2", f"name={name}"), str(db))
    return db


@pytest.fixture
def damaged_db(two_runs, tmp_path):
    """``damage(SQL)``: a copy of the two runs' store with SQL run on it (as a user's
    ``sqlite3 DB "update ..."`` would), its path."""
    def damage(sql: str) -> str:
        db = tmp_path / "damaged.db"
        with closing(sqlite3.connect(two_runs)) as src, closing(sqlite3.connect(db)) as dst:
            src.backup(dst)
        with closing(sqlite3.connect(db)) as conn:
            conn.executescript(sql)
        return str(db)
    return damage


# (table, the damage, what the one line names, whether `fedlm runs` shows the run damaged)
ROWS = [
    ("runs", "config_json='not json'", "runs.config_json is not JSON", True),
    ("runs", "config_json='[1]'", "runs.config_json is JSON but not an object", True),
    ("runs", "config_json='{\"data\": 5}'", "no readable data.tokenizer", True),
    ("runs", "virtual_time='abc'", "runs.virtual_time is 'abc', not a number", True),
    ("runs", "updates=2.5", "runs.updates is 2.5, not an integer", True),
    ("runs", "name=x'00ff'", "runs.name is 2 bytes of binary data, not text", True),
    ("runs", "status='running', owner_pid=4611686018427387904",
     "runs.owner_pid is 4611686018427387904, not a process id", True),
    ("metrics", "perplexity='abc'", "perplexity is 'abc', not a number", True),
    ("updates", "applied_version='x'", "applied_version is 'x', not an integer", True),
    ("workers", "step_time='slow'", "step_time is 'slow', not a number", False),
    ("intervals", "t_end=x'0001'", "t_end is 2 bytes of binary data, not a number", False),
    ("jobs", "local_steps='many'", "local_steps is 'many', not an integer", False),
    ("events", "detail='not json' WHERE kind='round_drawn' AND run_id=1; INSERT INTO events "
     "(run_id, virtual_time, wall_time, kind, detail) VALUES (1, 0, 0, 'round_drawn', 'x')",
     "round_drawn event is not a drawn round", False),
]
ROWS = [(f"UPDATE {table} SET {damage}" + ("" if "WHERE" in damage else " WHERE " + (
    "id=1" if table == "runs" else "run_id=1")), named, listed)
        for table, damage, named, listed in ROWS]


@pytest.mark.parametrize("sql, named, listed", ROWS, ids=[r[1][:30] for r in ROWS])
def test_a_damaged_row_is_listed_as_damaged_and_show_says_what_in_one_line(damaged_db, sql,
                                                                          named, listed):
    db = damaged_db(sql)
    rc, out, err = run_cli(["runs", "--db", db])
    assert rc == 0 and err == "" and "Traceback" not in out
    lines = out.splitlines()
    assert len(lines) == 3  # the header, run 1, run 2
    assert lines[2].split()[:2] == ["2", "finished"] and lines[2].endswith("second")
    if listed:
        assert lines[1].split()[:2] == ["1", "damaged"] and named in lines[1]
    else:  # what the listing reads of it is whole: listed as ever
        assert lines[1].split()[:2] == ["1", "finished"]
    rc, out, err = run_cli(["show", "1", "--db", db])
    assert_refused(rc, out, err, f"run 1 in {db} is damaged: ")
    assert named in err and out == ""
    rc, out, err = run_cli(["show", "2", "--db", db])
    assert rc == 0 and "run 2 (second)" in out


def test_replay_resume_and_a_tracker_refuse_a_damaged_run_in_one_line(damaged_db):
    db = damaged_db("UPDATE runs SET config_json='not json' WHERE id=1")
    for argv in (["replay", "1"], ["run", "--resume", "1"], ["export", "1", "--track",
                                                              "tensorboard"]):
        rc, out, err = run_cli([*argv, "--db", db])
        assert_refused(rc, out, err, "runs.config_json is not JSON ('not json')")
    with pytest.raises(store.StoreError, match="runs.config_json is not JSON"):
        store.config_of(db, 1)
    assert store.tokenizer_of("not json") == "damaged"


def test_export_writes_a_damaged_run_as_stored_in_csv_and_refuses_parquet(damaged_db,
                                                                         tmp_path):
    db = damaged_db("UPDATE metrics SET perplexity='abc' WHERE run_id=1")
    out_dir = tmp_path / "parquet"
    rc, out, err = run_cli(["export", "1", "--db", db, "--format", "parquet", "--out",
                            str(out_dir)])
    assert_refused(rc, out, err, "--format csv writes its rows as stored")
    assert not out_dir.exists()  # nothing made for a refusal
    rc, out, err = run_cli(["export", "1", "--db", db, "--out", str(tmp_path / "csv")])
    assert rc == 0 and "is damaged (metrics row" in err and len(err.splitlines()) == 1
    metrics = (tmp_path / "csv" / "run1_metrics.csv").read_text()
    assert "abc" in metrics  # the rows as stored: the damage can be seen and mended
    rc, out, err = run_cli(["export", "2", "--db", db, "--format", "parquet", "--out",
                            str(out_dir)])
    assert rc == 0 and err == "" and (out_dir / "run2_metrics.parquet").exists()


def test_a_damaged_time_reads_as_not_a_time(damaged_db):
    db = damaged_db("UPDATE runs SET status='running', created_at=1e300, heartbeat_at=NULL, "
                    "owner_host='elsewhere' WHERE id=1")
    row = store.run_row(db, 1)
    assert store.last_seen(row) == "at 1e+300 (not a time)"
    rc, out, err = run_cli(["show", "1", "--db", db])
    assert rc == 1 and "last seen at 1e+300 (not a time)" in err and "Traceback" not in err


def test_the_damage_reader_finds_no_damage_in_a_whole_store(two_runs):
    assert readers.damage(two_runs, 1) is None and readers.damage(two_runs, 2) is None
    assert [r["damaged"] for r in store.list_runs(two_runs)] == [None, None]
    with pytest.raises(KeyError):
        readers.damage(two_runs, 3)


# -- The data cache: rebuilt whole ---------------------------------------------

@pytest.fixture
def corpus_cache(tmp_path, monkeypatch):
    """A corpus of its own (two short texts) in a cache of its own: (its config, the
    cache, the fresh corpus)."""
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("Shall I compare thee to a summer's day?\n" * 30)
    (tmp_path / "texts" / "b.txt").write_text("My mistress' eyes are nothing like the sun;\n" * 30)
    cache = tmp_path / "cache"
    monkeypatch.setenv("FEDLM_CACHE", str(cache))
    data.load_corpus.cache_clear()
    cfg = DataConfig(source=f"text:{tmp_path}/texts/*.txt", seq_len=16)
    fresh = data.load_corpus(cfg)
    data.load_corpus.cache_clear()
    yield cfg, cache, fresh
    data.load_corpus.cache_clear()


def _same(a, b) -> bool:
    return (a.titles, a.genres) == (b.titles, b.genres) and all(np.array_equal(
        getattr(a, f), getattr(b, f)) for f in ("train", "val", "train_doc", "token_bytes"))


def _wrong_shape(path) -> None:  # a whole numpy archive that is not this corpus
    np.savez(path, train=np.zeros((3, 5), np.uint8), val=np.zeros((1, 5), np.uint8),
             train_doc=np.zeros(3, np.int32), titles=np.array(["a"]), genres=np.array(["g"]))


def _said(err: str) -> list[str]:
    """fedlm's lines of ``err``, without the progress bars of ``datasets``."""
    return [line for line in err.replace("\r", "\n").splitlines() if line.startswith("fedlm")]


PACKED_DAMAGE = {
    "emptied": lambda p: p.write_bytes(b""),
    "cut in half": lambda p: p.write_bytes(p.read_bytes()[:p.stat().st_size // 2]),
    "not numpy": lambda p: p.write_bytes(os.urandom(200)),
    "another shape": _wrong_shape,
    "a FIFO": lambda p: (p.unlink(), os.mkfifo(p)),
}


@pytest.mark.parametrize("how", PACKED_DAMAGE)
def test_a_damaged_packed_cache_is_said_and_rebuilt_whole(corpus_cache, how, capsys):
    cfg, cache, fresh = corpus_cache
    (packed,) = cache.glob("packed-*.npz")
    PACKED_DAMAGE[how](packed)
    again = data.load_corpus(cfg)  # a FIFO read would block: it is never opened
    err = capsys.readouterr().err
    assert _same(again, fresh)
    assert err.count("\n") == 1 and f"the data cache {packed} is damaged (" in err
    assert err.endswith("; rebuilding it\n")
    data.load_corpus.cache_clear()
    assert packed.is_file() and _same(data.load_corpus(cfg), fresh)  # written whole
    assert capsys.readouterr().err == ""  # and read as it is, the next time
    assert sorted(p.name for p in cache.iterdir() if ".tmp" in p.name) == []


def test_a_folder_where_the_cache_file_belongs_is_left_alone(corpus_cache, capsys):
    cfg, cache, fresh = corpus_cache
    (packed,) = cache.glob("packed-*.npz")
    packed.unlink()
    packed.mkdir()
    (packed / "mine.txt").write_text("keep")
    assert _same(data.load_corpus(cfg), fresh)  # rebuilt in memory
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a folder, not fedlm's file" in err
    assert (packed / "mine.txt").read_text() == "keep"


def test_a_damaged_tokens_cache_is_rebuilt_with_the_packed_one(corpus_cache, capsys):
    cfg, cache, fresh = corpus_cache
    (packed,), (tokens,) = cache.glob("packed-*.npz"), cache.glob("tokens-*.arrow")
    packed.write_bytes(b"")
    tokens.write_bytes(b"")
    assert _same(data.load_corpus(cfg), fresh)
    said = _said(capsys.readouterr().err)  # (and datasets' progress bar)
    assert len(said) == 2 and str(packed) in said[0] and str(tokens) in said[1]
    assert "is damaged" in said[1] and tokens.stat().st_size > 0


@pytest.mark.parametrize("how", ["cut", "edited", "folder"])
def test_a_damaged_tokenizer_json_is_trained_again(corpus_cache, how, capsys):
    cfg, cache, _ = corpus_cache
    cfg = replace(cfg, tokenizer="bpe:300")
    fresh = data.load_corpus(cfg)
    data.load_corpus.cache_clear()
    (bpe,) = cache.glob("bpe-*.json")
    good = bpe.read_text()
    capsys.readouterr()
    if how == "cut":
        bpe.write_text(good[:len(good) // 2])
    elif how == "edited":  # an id past the vocabulary: its embedding row does not exist
        doc = json.loads(good)
        doc["model"]["vocab"]["zz"] = 999
        bpe.write_text(json.dumps(doc))
    else:
        bpe.unlink()
        bpe.mkdir()
    assert _same(data.load_corpus(cfg), fresh)  # the same training: the same tokenizer
    said = _said(capsys.readouterr().err)
    assert len(said) == 1 and str(bpe) in said[0]
    if how == "folder":
        assert "is a folder" in said[0] and bpe.is_dir()
    else:
        assert "is damaged (" in said[0] and bpe.read_text() == good


# -- Traces: an id no trace has ------------------------------------------------

def _long_int_pickle(path) -> None:  # 111...1, 5,000 digits (no str() of it: past the cap)
    path.write_bytes(pickle.dumps({10**5000 // 9: {"computation": 50, "communication": 5000}}))


TRACES = {
    "a 5,000-digit integer key (pickle)": (_long_int_pickle, "has more than 300 digits"),
    "a 5,000-character key (JSON)": (
        lambda p: p.write_text(json.dumps({"1" * 5000: {"computation": 50,
                                                        "communication": 5000}})),
        "is 5,000 characters long"),
    "a 5,000-digit number (JSON)": (
        lambda p: p.write_text('{"1": {"computation": %s, "communication": 5000}}'
                               % ("1" * 5000)), "not valid JSON (a number of more than"),
    "JSON cut short": (lambda p: p.write_text('{"1": {"computation": 50,'), "not valid JSON"),
    "JSON nested too deep": (lambda p: p.write_text("[" * 100000), "not valid JSON (nested"),
}


@pytest.mark.parametrize("case", TRACES)
def test_a_trace_with_an_id_or_number_no_trace_has_is_refused_in_one_line(case, tmp_path):
    make, said = TRACES[case]
    path = tmp_path / "trace.json"
    make(path)
    with pytest.raises(ConfigError) as exc:
        traces.load_trace(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: ") and said in message and len(message) < 300
    rc, out, err = run_cli(["trace", "show", str(path)])
    assert_refused(rc, out, err, said)


def test_a_client_id_of_300_characters_is_still_read(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"7" * 300: {"computation": 50, "communication": 5000},
                                "2": {"computation": 60, "communication": 6000}}))
    kind, entries = traces.load_trace(path)
    assert kind == "device" and [e.key for e in entries] == ["2", "7" * 300]  # by number


# -- fedlm plan names the flag given -------------------------------------------

PLAN_FLAGS = [
    (["--data-centers", "0"], "--data-centers: must be >= 1, got 0"),
    (["--data-centres", "0"], "--data-centres: must be >= 1, got 0"),
    (["--data-centers", "2000000"], "--data-centers: must be <= 1,000,000, got 2000000"),
    (["--workers", "2000000"], "--workers: 2,000,000 workers without --data-centres"),
    (["--data-centres", "20000000"], "--data-centres: must be <= 1,000,000, got 20000000"),
    (["--workers", "3", "--data-centers", "2"], "over 2 data centres (--data-centers 2)"),
    (["--local-steps", "0"], "--local-steps: must be >= 1"),
    (["--H", "0"], "--H: must be >= 1"),
    (["--walltime", "--data-centers", "0"], "--data-centers: must be >= 1, got 0"),
    (["--walltime", "--local-steps", "0"], "--local-steps: must be >= 1"),
    (["--walltime", "--replicas", "0", "--data-centres", "4"], "--replicas: must be >= 1"),
    (["--set", "workers=2", "--data-centers", "2"], "--data-centers: the config describes"),
    (["--set", "workers=2", "--local-steps", "5"], "--local-steps: the config describes"),
]


@pytest.mark.parametrize("argv, said", PLAN_FLAGS, ids=[" ".join(a) for a, _ in PLAN_FLAGS])
def test_plan_names_the_flag_the_user_gave(argv, said):
    rc, out, err = run_cli(["plan", *argv])
    assert_refused(rc, out, err, said)


# -- Two `fedlm states --clean` at the same time -------------------------------

@pytest.fixture
def states_cache(tmp_path, monkeypatch):
    monkeypatch.setattr("fedlm.worker.states.cache_dir", lambda: tmp_path / "cache")
    root = tmp_path / "cache" / "worker-state"
    for name in ("a", "b", "c", "d" + state_folders.GOING):  # unknown owners, and one going
        for w in range(3):
            (root / name / f"worker{w}").mkdir(parents=True)
            for j in range(20):
                (root / name / f"worker{w}" / f"job{j}.pt").write_bytes(b"x" * 100)
    return root


def test_a_folder_another_clean_removed_is_no_error(states_cache):
    first = [f for f in state_folders.survey(older_than=0) if f.removable]
    second = [f for f in state_folders.survey(older_than=0) if f.removable]
    assert len(first) == len(second) == 4
    assert [state_folders.remove(f) for f in first] == [True] * 4
    assert [state_folders.remove(f) for f in second] == [False] * 4  # gone: not an error
    assert list(states_cache.iterdir()) == []


def test_a_folder_emptied_by_another_clean_during_the_removal_is_no_error(states_cache,
                                                                          monkeypatch):
    """The other clean deletes a file of the folder between this one's listing of it and
    its deletions (what two removals of one interrupted folder do at once)."""
    (going,) = [f for f in state_folders.survey(older_than=0) if f.path.name.endswith(
        state_folders.GOING)]
    real = os.scandir
    taken = []

    def listed_then_taken(fd):  # shutil.rmtree lists a folder, then deletes what it listed
        if not isinstance(fd, int):
            return real(fd)
        with real(fd) as it:
            entries = list(it)
        for entry in entries:
            if entry.name.startswith("job") and not taken:
                os.unlink(entry.name, dir_fd=fd)  # the other clean was quicker
                taken.append(entry.name)
        return nullcontext(entries)

    with monkeypatch.context() as m:
        m.setattr(os, "scandir", listed_then_taken)
        assert state_folders.remove(going) is True  # this one ended it: its rmdir did
    assert taken and not going.path.exists()


def test_two_cleans_at_once_both_end_cleanly(states_cache, monkeypatch, capsys):
    """Both survey before either removes (a barrier after each survey), then remove the
    same folders at once: each ends with status 0, every folder is gone, and between
    them they say each folder was removed once."""
    real_survey = state_folders.survey
    both_surveyed = threading.Barrier(2, timeout=60)

    def survey_then_wait(older_than=None):
        found = real_survey(older_than)
        both_surveyed.wait()
        return found

    monkeypatch.setattr(state_folders, "survey", survey_then_wait)
    status = {}

    def clean(k: int) -> None:
        status[k] = cli.main(["states", "--clean", "--older-than", "0"])

    threads = [threading.Thread(target=clean, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    out, err = capsys.readouterr()  # the two threads' lines, in one stream
    assert not any(t.is_alive() for t in threads)
    assert status == {0: 0, 1: 0} and err == "", (status, err)
    assert list(states_cache.iterdir()) == []
    removed = [int(n) for n in re.findall(r"removed (\d+) folders", out)]
    assert len(removed) == 2 and sum(removed) == 4, out
