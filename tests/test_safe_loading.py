"""Loading runs no one's code and reads bounded input (fedlm/files.py, fedlm/checkpoint.py,
fedlm/sim/traces.py): a crafted checkpoint, a FIFO, a device, a huge file, a pickle of
shared or deeply nested containers are each refused in one line, at once."""

import hashlib
import json
import io
import os
import pickle
import struct
import threading

import pytest
import torch

from fedlm import checkpoint, files
from fedlm.config_load import ConfigError
from fedlm.engine import Interrupted
from fedlm.runner import run_inprocess
from fedlm.sim import traces
from fedlm.store import list_runs
from tests.conftest import tiny_config


class _Payload:
    """Unpickling it calls ``open(marker, "w")``: code run by whoever loads the file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _evil_checkpoint(path, marker) -> None:
    """A file in fedlm's checkpoint format, with a correct digest, whose payload runs code."""
    buf = io.BytesIO()
    torch.save({"params": _Payload(str(marker)), "engine": {}}, buf)
    data = buf.getvalue()
    path.write_bytes(checkpoint.MAGIC + hashlib.sha256(data).hexdigest().encode() + data)


def test_a_crafted_checkpoint_given_as_init_from_runs_no_code(tmp_path):
    evil, marker = tmp_path / "evil.pt", tmp_path / "ran"
    _evil_checkpoint(evil, marker)
    with pytest.raises(ConfigError) as err:
        run_inprocess(tiny_config(f"init.from={evil}"), str(tmp_path / "r.db"))
    assert not marker.exists()
    assert str(err.value).startswith(f"init.from: {evil}: holds ") and "\n" not in str(err.value)
    assert "does not load" in str(err.value)
    # a plain torch.save'd state dict with the same payload: refused the same way
    plain = tmp_path / "plain.pt"
    torch.save({"w": _Payload(str(marker))}, plain)
    with pytest.raises(ConfigError, match="^init.from: "):
        run_inprocess(tiny_config(f"init.from={plain}"), str(tmp_path / "r2.db"))
    assert not marker.exists()


def test_a_crafted_checkpoint_dropped_into_a_crashed_runs_folder_runs_no_code(tmp_path):
    sets = ["strategy=diloco", "updates=8", "reliability.checkpoint_every=2"]
    ref_db, db = tmp_path / "reference.db", tmp_path / "stopped.db"
    run_inprocess(tiny_config(*sets), str(ref_db))
    stop = []
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*sets), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= 4 else None)
    folder = checkpoint.folder_for(db, 1)
    marker = tmp_path / "ran"
    _evil_checkpoint(folder / "ckpt-v999999999.pt", marker)
    run_inprocess(tiny_config(*sets), str(db), resume=1)  # the crafted newest is skipped
    assert not marker.exists()
    (ref,), (run,) = list_runs(ref_db), list_runs(db)
    assert (run["status"], run["final_hash"]) == ("finished", ref["final_hash"])


RICH = ["strategy=delayed-nesterov", "local_steps=dylu-online", "fleet.preset=very",
        "faults.crash=0.1", "faults.offline=0.1", "data.shards=5", "data.shard_choice=paper",
        "inner.schedule=shard", "updates=8", "reliability.checkpoint_every=2"]


@pytest.mark.parametrize("extra", [["network.server_up=3e6"],
                                   ["fleet.slowdown={factor = 2, normal = 20, slow = 10}",
                                    "fleet.join=[0, 5, 0]"],
                                   ["strategy=diloco", "local_steps=fill"],
                                   ["strategy=halos", "workers=4", "fleet.preset=halos",
                                    "fleet.base_step_time=0.0004"]],
                         ids=["shared-link", "dynamics", "sync-fill", "halos"])
def test_every_engine_state_part_loads_without_pickled_code(tmp_path, extra):
    # checkpoints of runs with the engine's richest states (async, faults, a shared link
    # with flows in flight, a fleet that changes, the paper's shards, a sync round's
    # held results, region servers' transfers) read back whole
    sets = [*RICH, *extra]
    stop = []
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*sets), str(tmp_path / "a.db"), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= 6 else None)
    saved = sorted(checkpoint.folder_for(tmp_path / "a.db", 1).glob("ckpt-v*.pt"))
    assert saved
    for path in saved:
        assert checkpoint.read(path)["engine"]["model"]["params"]


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "too big"])
def test_files_that_are_not_plain_bounded_files_are_refused_at_once(tmp_path, kind,
                                                                     monkeypatch):
    if kind == "fifo":
        path = tmp_path / "trace.json"
        os.mkfifo(path)
    elif kind == "device":
        path = "/dev/zero"
    elif kind == "directory":
        path = tmp_path
    else:
        path = tmp_path / "trace.json"
        path.write_text('{"1": {"computation": 1, "communication": 1}}' + " " * 4096)
        monkeypatch.setitem(files.CAPS, "trace", 1024)
    done = []

    def load():  # in a thread, so that a blocking read fails the test instead of hanging it
        try:
            traces.read_trace(path)
        except ConfigError as exc:
            done.append(str(exc))

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert done, f"reading {kind} did not end in a refusal within 10 s"
    why = {"fifo": "is a FIFO, not a regular file", "device": "is a character device",
           "directory": "is a directory", "too big": "more than the 0.0 MiB fedlm reads"}
    assert why[kind] in done[0] and "\n" not in done[0]


def test_a_file_read_whole_is_bounded_by_the_memory_there_is(tmp_path, monkeypatch):
    """init.from, checkpoints and worker states are read whole: one larger than the memory
    this process can read it into now is refused in one line, whatever the 64 GiB cap."""
    path = tmp_path / "weights.pt"
    path.write_bytes(b"\0" * 4096)
    monkeypatch.setattr(files, "for_one_read", lambda: 1024)
    for what in ("checkpoint", "worker state"):
        with pytest.raises(files.FileRefused, match=f"the {what} is 0.0 MiB, more than the "
                                                    f"0.0 MiB of memory this process can read"):
            files.check(path, what)
    assert files.check(path, "trace") == 4096  # a small file of its own cap (512 MiB)
    with pytest.raises(ConfigError, match="of memory this process can read it into now"):
        run_inprocess(tiny_config(f"init.from={path}"), str(tmp_path / "r.db"))


def test_a_config_or_checkpoint_that_is_a_device_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a character device, not a regular file"):
        run_inprocess(tiny_config("init.from=/dev/zero"), str(tmp_path / "r.db"))
    with pytest.raises(files.FileRefused, match="is a character device"):
        checkpoint.read("/dev/zero")
    from fedlm.config_load import read_toml
    with pytest.raises(ConfigError, match="^config: /dev/zero: the config is a character"):
        read_toml("/dev/zero", "config")


def _window(x):
    return {"active": x, "inactive": [1], "finish_time": 10}


def test_pickles_of_shared_or_deep_containers_are_refused_in_one_line(tmp_path):
    shared = [1.0]
    for _ in range(60):  # 600 bytes that walk as 2^60 numbers
        shared = [shared, shared]
    (tmp_path / "shared.pkl").write_bytes(pickle.dumps({1: _window(shared)}, protocol=4))
    deep = [1.0]
    for _ in range(200):
        deep = [deep]
    (tmp_path / "deep.pkl").write_bytes(pickle.dumps({1: _window(deep)}, protocol=4))
    # a client id that is a tuple of 80 levels of a shared tuple: hashing it while the
    # dict is built would take 2^80 steps (written opcode by opcode: building it here
    # would hang as well)
    ops = bytearray(b"\x80\x04}K\x01\x85\x94")  # PROTO 4, {}, (1,), memo 0
    for i in range(80):
        ops += b"j" + struct.pack("<I", i) + b"j" + struct.pack("<I", i) + b"\x86\x94"
    ops += b"}s."  # the value {}, SETITEM, STOP
    (tmp_path / "tuple.pkl").write_bytes(bytes(ops))
    for name, why in [("shared", "refers to one list, dict or tuple twice"),
                      ("deep", "nested more than 8 deep"),
                      ("tuple", "refers to one list, dict or tuple twice")]:
        with pytest.raises(ConfigError) as err:
            traces.read_trace(tmp_path / f"{name}.pkl")
        assert why in str(err.value) and "\n" not in str(err.value)
    # repeated strings (pickle shares repeated keys) are fine
    ok = {i: {"computation": 1.0, "communication": 2.0} for i in range(1, 4)}
    (tmp_path / "ok.pkl").write_bytes(pickle.dumps(ok, protocol=4))
    assert len(traces.read_trace(tmp_path / "ok.pkl")) == 3


def test_a_run_owns_its_trace_resume_and_replay_refuse_other_contents(tmp_path):
    from fedlm.store import inputs
    from fedlm.replay import ReplayError, replay
    from fedlm.store import input_pins

    trace = tmp_path / "avail.json"
    trace.write_text(json.dumps({str(k): {"active": [0.0, 600.0], "inactive": [400.0, 900.0],
                                          "finish_time": 1000.0} for k in (1, 2, 3)}))
    sets = [f"fleet.availability_trace={trace}", "fleet.trace_time_scale=0.1",
            "strategy=diloco", "updates=8", "reliability.checkpoint_every=2"]
    ref_db, db = tmp_path / "reference.db", tmp_path / "stopped.db"
    run_inprocess(tiny_config(*sets), str(ref_db))
    (pin,) = [json.loads(d) for d in input_pins(ref_db, 1)]
    assert pin["key"] == "fleet.availability_trace" and len(pin["sha256"]) == 64
    assert replay(ref_db, 1).identical
    stop = []
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*sets), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= 4 else None)
    original = trace.read_text()
    trace.write_text(original.replace("400.0", "350.0"))  # another fleet, the same path
    with pytest.raises(ConfigError) as err:
        run_inprocess(tiny_config(*sets), str(db), resume=1)
    assert str(err.value).startswith(f"fleet.availability_trace: {trace} is not the file run 1 "
                                     f"started with") and "refusing to resume" in str(err.value)
    with pytest.raises(ReplayError, match="refusing to replay it on other contents"):
        replay(ref_db, 1)
    trace.write_text(original)  # put back: both go on
    run_inprocess(tiny_config(*sets), str(db), resume=1)
    (ref,), (run,) = list_runs(ref_db), list_runs(db)
    assert run["final_hash"] == ref["final_hash"] and replay(ref_db, 1).identical
    assert inputs.pins(tiny_config(*sets)) == [pin]


def test_a_cache_file_that_cannot_be_written_leaves_nothing_and_names_itself(tmp_path):
    from fedlm import files

    def half_then_full(tmp):
        tmp.write_bytes(b"half a corpus")
        raise OSError(28, "No space left on device")  # as np.savez says it: no filename

    target = tmp_path / "packed-x.npz"
    with pytest.raises(OSError) as err:
        files.write_cache(target, half_then_full)
    assert err.value.filename == str(target) and "No space left" in err.value.strerror
    assert list(tmp_path.iterdir()) == []  # no temporary file filling the disk further
    files.write_cache(target, lambda tmp: tmp.write_bytes(b"whole"))
    assert target.read_bytes() == b"whole" and list(tmp_path.iterdir()) == [target]


@pytest.mark.parametrize("kind", ["evil", "truncated", "fifo", "junk"])
def test_a_worker_state_that_is_evil_truncated_or_not_a_file_is_one_line_of_ours(tmp_path,
                                                                                 kind):
    """Read back by the next job; torch's own words (a truncated zip, or its advice to
    load a pickle with code in it with weights_only=False) are not shown, no code runs."""
    from fedlm.worker.states import BadState, read_state

    path, marker = tmp_path / "job7.pt", tmp_path / "ran"
    if kind == "evil":
        torch.save({"m": _Payload(str(marker))}, path)
    elif kind == "truncated":
        torch.save({"m": torch.zeros(100)}, path)
        path.write_bytes(path.read_bytes()[:60])
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(b"not a state")
    with pytest.raises(BadState) as err:
        read_state(path)
    text = str(err.value)
    assert str(path) in text and "\n" not in text and "weights_only" not in text
    assert not marker.exists()
