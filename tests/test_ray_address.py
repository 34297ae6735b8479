"""``sim.ray_address`` refused in one line, in bounded time, before anything is stored:
a port no socket can have, a head that is not there, a port where something that is
not Ray listens (``ray.init`` retries each of the last two for ever), and the setting
with the in-process backend (which runs no Ray). A real cluster passes the same check
(tests/test_flower_cluster.py runs through it)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from fedlm.errors import ConfigError
from fedlm.flower.simulation import check_ray_head
from tests.conftest import tiny_config


@pytest.mark.parametrize("address", ["host:0", "host:99999", "host:", ":6379", "host"])
def test_an_address_that_no_socket_can_have_is_refused_by_the_config(address):
    with pytest.raises(ConfigError, match="sim.ray_address: must be HOST:PORT"):
        tiny_config(f"sim.ray_address={address}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def test_a_head_that_is_not_there_is_refused_at_once():
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"no Ray head answers at .* \(Connection refused\)"):
        check_ray_head(f"127.0.0.1:{_free_port()}", timeout=2)
    assert time.monotonic() - start < 5


def test_a_port_where_something_else_listens_is_refused_in_bounded_time():
    with socket.socket() as listener:  # accepts connections, never speaks Ray's protocol
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        start = time.monotonic()
        with pytest.raises(ConfigError, match="its port accepts, but no Ray GCS replies|"
                                              "something listens there, but not Ray"):
            check_ray_head(f"127.0.0.1:{listener.getsockname()[1]}", timeout=2)
        assert time.monotonic() - start < 2 + 10 + 5


def test_the_in_process_backend_refuses_the_setting_before_storing_anything(tmp_path):
    db = tmp_path / "runs.db"
    out = subprocess.run([sys.executable, "-m", "fedlm", "run", "--backend", "inprocess",
                          "--db", str(db), "--set", "model=tiny",
                          "--set", "sim.ray_address=127.0.0.1:6379"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "fedlm: error: sim.ray_address: attaches Flower's Ray actors to a cluster; "
        "--backend inprocess runs no Ray (drop one of the two)"]
    assert not db.exists()
