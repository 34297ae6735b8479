"""The shared network: fair sharing of the server's links, waiting shown as intervals."""

import sqlite3

import pytest

from fedlm.sim import fleet
from fedlm.sim.network import Flow, Network, fair_rates
from fedlm.params import num_bytes
from tests.conftest import tiny_config
from tests.support import run_engine


def test_fair_rates_share_what_is_left_equally():
    flows = [Flow("up", 1.0, cap) for cap in (1.0, 10.0, 10.0)]
    assert fair_rates(flows, 9.0) == [1.0, 4.0, 4.0]  # the slow link takes only its cap
    assert fair_rates(flows, 0.0) == [1.0, 10.0, 10.0]  # unlimited server link
    assert fair_rates(flows, 30.0) == [1.0, 10.0, 10.0]


def test_a_flow_finishes_when_its_share_says():
    net = Network(server_down=0, server_up=100.0)
    net.add(0.0, (0, "up"), "up", 100.0, cap=1000.0)
    net.add(0.0, (1, "up"), "up", 300.0, cap=1000.0)
    assert net.next_finish() == pytest.approx(2.0)  # 50 B/s each
    assert net.advance(2.0) == [(0, "up")]
    assert net.next_finish() == pytest.approx(4.0)  # then 100 B/s alone for 200 B


def test_a_flow_ending_as_another_starts_is_still_handed_out():
    net = Network(server_down=0, server_up=100.0)
    net.add(0.0, (0, "up"), "up", 100.0, cap=1000.0)
    net.add(1.0, (1, "up"), "up", 100.0, cap=1000.0)  # at the very moment flow 0 ends
    assert net.advance(1.0) == [(0, "up")]  # not lost inside add()
    assert net.next_finish() == pytest.approx(2.0)


def test_daily_cycle_slows_the_peak_hour():
    net = Network(0, 0, daily_amplitude=0.5, peak_hour=14.0)
    assert net.factor(14.2 * 3600) == pytest.approx(1 - 0.5 * 0.5 * (1 + 1.0), abs=0.01)
    assert net.factor(2.5 * 3600) == pytest.approx(1.0, abs=0.01)


def _round_time(workers: int, server_up: float) -> tuple[float, str]:
    cfg = tiny_config(f"workers={workers}", "strategy=fedavg", "updates=2", "fleet.jitter=0",
                      "fleet.preset=homogeneous", f"network.server_up={server_up}",
                      "reliability.checkpoint_every=0")
    return cfg


@pytest.mark.parametrize("workers", [2, 6])
def test_sync_round_pays_for_the_shared_upload(tmp_path, workers):
    server_up = 2e6  # bytes/s: far below the workers' own 10 Gbit/s links
    cfg = _round_time(workers, server_up)
    db = tmp_path / "n.db"
    engine, final, _ = run_engine(cfg, db, evaluate=False)
    region = fleet.REGIONS["local"]
    size = num_bytes(final)
    down = region.latency + size / region.down_bw
    up = region.latency + workers * size / server_up  # all upload at once: 1/N each
    expected = 2 * (down + cfg.inner.steps * cfg.fleet.base_step_time + up)
    assert engine.now == pytest.approx(expected, rel=1e-6)
    with sqlite3.connect(db) as conn:
        wait = conn.execute("SELECT SUM(t_end - t_start) FROM intervals"
                            " WHERE kind='link wait'").fetchone()[0]
    own_link = size / region.up_bw
    assert wait == pytest.approx(2 * workers * (workers * size / server_up - own_link), rel=1e-6)


def test_more_data_centres_cost_more_on_a_shared_link(tmp_path):
    # Each extra uploader adds a whole model's worth of bytes to every round's upload.
    runs = [run_engine(_round_time(n, 2e6), tmp_path / f"{n}.db", evaluate=False)
            for n in (2, 4)]
    size = num_bytes(runs[0][1])
    assert runs[1][0].now - runs[0][0].now == pytest.approx(2 * 2 * size / 2e6, rel=1e-6)


def test_hierarchical_regions_train_as_pods_and_talk_once_each(tmp_path):
    # Six workers in three regions: each region is one data-parallel pod (two
    # workers' batches per step), and the server sees three workers, not six.
    common = ["workers=6", "fleet.topology={us = 2, eu = 2, asia = 2}", "strategy=diloco",
              "fleet.jitter=0", "reliability.checkpoint_every=0", "updates=2"]
    db = tmp_path / "h.db"
    engine, _, run_id = run_engine(tiny_config(*common, "network.hierarchical=true"), db)
    flat_engine, _, _ = run_engine(tiny_config(*common), tmp_path / "flat.db")
    assert len(engine.fleet) == 3 and [p.members for p in engine.fleet] == [2, 2, 2]
    assert [p.region.name for p in engine.fleet] == ["us", "eu", "asia"]
    assert engine.jobs_done == 2 * 3 and flat_engine.jobs_done == 2 * 6
    assert engine.tokens == flat_engine.tokens  # same data per round, half the messages
    with sqlite3.connect(db) as conn:
        up = conn.execute("SELECT SUM(up_bytes) FROM jobs").fetchone()[0]
        flat_up = sqlite3.connect(tmp_path / "flat.db").execute(
            "SELECT SUM(up_bytes) FROM jobs").fetchone()[0]
    assert up * 2 == flat_up  # one WAN upload per region instead of one per worker
    from fedlm.replay import replay

    assert replay(db, run_id).identical
