"""A deployment node's worker process (fedlm.deploy.node_client / fedlm.deploy.node_worker), without Flower's
engine: reused across messages, restarted after a kill, gone with its SuperNode."""

import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict

import pytest
import torch
from flwr.app import ConfigRecord, RecordDict

from fedlm.flower import messages
from fedlm.deploy import node_client
from fedlm.job import JobSpec

BARE_QUERY = RecordDict({"ask": ConfigRecord({"what": "partition-id"})})  # no warm-up


@pytest.fixture
def node(tmp_path):
    """A stand-in SuperNode (a sleeping process) and the worker socket path next to it."""
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    started: list[int] = []
    yield parent, tmp_path / "w.sock", started
    parent.kill()
    parent.wait()
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _query(path, parent, started, partition=1):
    answer = node_client.ask_worker(path, parent.pid, {
        "kind": "query", "content": node_client.encode(BARE_QUERY),
        "node_config": {"partition-id": partition, "num-partitions": 4}})
    started.append(answer["pid"])
    assert messages.read_partition_answer(node_client.decode(answer["content"])) == (partition, 4)
    return answer["pid"]


def _gone(pid, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:  # started from this test's process: a child, reaped here
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_the_worker_process_is_reused_across_messages(node):
    parent, path, started = node
    first = _query(path, parent, started)
    assert first != os.getpid()
    assert _query(path, parent, started, partition=2) == first


def test_a_killed_worker_process_is_restarted_by_the_next_message(node):
    parent, path, started = node
    first = _query(path, parent, started)
    os.kill(first, signal.SIGKILL)
    assert _gone(first)
    second = _query(path, parent, started)
    assert second != first


def test_an_error_in_a_job_is_raised_and_the_worker_lives_on(node):
    parent, path, started = node
    first = _query(path, parent, started)
    with pytest.raises(RuntimeError, match="KeyError"):
        node_client.ask_worker(path, parent.pid, {
            "kind": "train", "content": node_client.encode(BARE_QUERY),
            "node_config": {"partition-id": 1, "num-partitions": 4}})
    assert _query(path, parent, started) == first


def test_the_worker_process_exits_with_its_supernode(node):
    parent, path, started = node
    pid = _query(path, parent, started)
    parent.kill()
    parent.wait()
    assert _gone(pid, timeout=10)
    assert not path.exists()


def test_a_message_crosses_the_socket_bit_for_bit():
    params = OrderedDict(w=torch.randn(3, 5), b=torch.arange(4, dtype=torch.int64))
    job = JobSpec(job_id=7, worker=1, base_version=3, local_steps=2, data_seed=11)
    content = messages.train_request(job, params, '{"x": 1}', "run-key")
    back = messages.read_train_request(node_client.decode(node_client.encode(content)))
    assert back.job == job and back.cfg_json == '{"x": 1}' and back.run_key == "run-key"
    for k, v in params.items():
        assert torch.equal(back.params[k], v) and back.params[k].dtype == v.dtype


def test_the_per_message_clientapp_does_not_import_torch():
    code = ("import sys, fedlm.deploy.node_client; "
            "assert 'torch' not in sys.modules and 'fedlm.worker.train' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
