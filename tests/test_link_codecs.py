"""Fewer bytes only where the link is slow (``network.slow_compression``,
fedlm/sim/link_codecs.py): which workers, their jobs' bytes and encoding, the run's
replay and resume, and the settings refused in one line."""

import sqlite3
from pathlib import Path

import pytest

from fedlm.config_load import ConfigError
from fedlm.sim.fleet import Region, WorkerProfile
from fedlm.sim.link_codecs import slow_workers
from tests.conftest import tiny_config
from tests.support import trains_replays_and_resumes


def _profile(w: int, step_time: float, bandwidth: float, latency: float = 0.1):
    return WorkerProfile(w, step_time, 0.0, Region(f"r{w}", latency, bandwidth, bandwidth))


def test_a_link_is_slow_where_its_whole_model_exchange_outlasts_its_h_steps():
    # 1 MB down and 0.5 MB up: 0.1 + 1.0 + 0.1 + 0.5 = 1.7 s at 1 MB/s, 0.37 s at 10 MB/s
    fleet = [_profile(0, 0.1, 1e6), _profile(1, 0.1, 1e7), _profile(2, 0.2, 1e6)]
    # H = 10: compute 1 s, 1 s and 2 s
    assert slow_workers(fleet, 1_000_000, 500_000, steps=10) == {0}
    assert slow_workers(fleet, 1_000_000, 500_000, steps=100) == set()


FAR = ["strategy=diloco-fill", "profile=halos", "workers=8", "inner.steps=5",
       "fleet.base_step_time=0.006", "updates=3"]


def test_the_slow_links_send_fewer_bytes_and_the_run_replays_and_resumes(tmp_path):
    ref = trains_replays_and_resumes(tmp_path, *FAR, "network.slow_compression=int4")
    with sqlite3.connect(ref) as conn:
        sizes = dict(conn.execute("SELECT worker, max(up_bytes) FROM jobs GROUP BY worker"))
    fp32 = max(sizes.values())
    slow = {w for w, b in sizes.items() if b < fp32}
    assert slow and len(slow) < len(sizes)  # some links are slow, not all
    assert all(sizes[w] < fp32 / 7 for w in slow)  # int4: about 1/8 of fp32
    plain = tmp_path / "plain.db"
    from fedlm.runner import run_inprocess

    run_inprocess(tiny_config(*FAR), str(plain))
    with sqlite3.connect(plain) as conn:
        assert {b for (b,) in conn.execute("SELECT DISTINCT up_bytes FROM jobs")} == {fp32}


# the far workers' exchange well above their H steps of compute (the frontier study's (b))
EXCHANGE_BOUND = ["strategy=diloco-fill", "profile=halos", "workers=8", "inner.steps=5",
                  "fleet.base_step_time=0.0004", "updates=3"]


def test_fill_sizes_a_slow_links_jobs_on_the_bytes_it_sends(tmp_path):
    """Fill ends every job with the round's slowest whole job: a far worker whose upload
    is int4 is timed at int4, so its round is shorter (sized on fp32, the far workers
    idled at the barrier for the time their encoding saved: 0.99x plain's time)."""
    from fedlm.runner import run_inprocess

    times = {}
    for name, extra in (("plain", []), ("int4", ["network.slow_compression=int4"])):
        db = tmp_path / f"{name}.db"
        run_inprocess(tiny_config(*EXCHANGE_BOUND, *extra), str(db))
        with sqlite3.connect(db) as conn:
            times[name], = conn.execute("SELECT virtual_time FROM runs").fetchone()
    assert times["int4"] < 0.8 * times["plain"]


@pytest.mark.parametrize("sets, message", [
    (["network.slow_compression=int3"], r"^network\.slow_compression: must be fp32"),
    (["network.slow_compression=int4", "network.server_up=1e6"], "a shared server link"),
    (["network.slow_compression=int4", "network.topology=ring"], "a star of workers' own"),
    (["network.slow_compression=int4", "stream.fragments=2", "inner.steps=4"],
     "StreamedServer sends or times its own jobs"),
    (["network.slow_compression=int4", "strategy=eager_diloco:CorrectedEagerDiLoCo"],
     "EagerServer sends or times its own jobs"),
])
def test_what_cannot_send_per_link_encodings_is_refused_in_one_line(sets, message,
                                                                    monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "examples"))
    with pytest.raises(ConfigError, match=message) as err:
        tiny_config(*sets)
    assert "\n" not in str(err.value)
