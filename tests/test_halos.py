"""strategy = halos: region servers and a global server, both asynchronous
(``fedlm.strategies.halos``, composed by ``fedlm.servers.regions``; the messages'
timing in ``fedlm/engine/transfers.py``)."""

import re
import sqlite3
from dataclasses import replace

import pytest

from fedlm import servers, store
from fedlm.errors import ConfigError
from fedlm.replay import replay
from fedlm.runner import run_inprocess
from fedlm.sim import fleet
from fedlm.strategies import registry
from fedlm.strategies.halos import Halos
from tests.conftest import tiny_config
from tests.support import scalar as _p, scalar_update as _update, value as _v


def _regions(*sets: str, topology: str):
    """HALoS's region servers (``fedlm.servers.regions``) on one-number models, started,
    their strategies built from ``outer.*`` ``sets``; and a way to send a job's update."""
    cfg = tiny_config("strategy=halos", "workers=2", f"fleet.topology={topology}",
                      *(f"outer.{s}" for s in sets))
    server = servers.build(cfg, registry.build_strategy(cfg.strategy, cfg.outer))
    server.start(_p(0.0), server.worker_links(fleet.node_profiles(cfg)))

    def update(worker: int, g: float) -> None:  # dispatched, then its update is in
        server.dispatched(worker, server.version)
        u = _update(worker, g)
        assert server.take(replace(u, staleness=server.staleness(worker, 0))) is None
    return server, update


def _deliver(server, message):
    """``message`` arrives: (the evaluated model's value, its staleness)."""
    new, staleness = server.deliver(message.key)
    if new is not None:
        server.new_version(new)
    return _v(server.params), staleness


def test_two_regions_two_workers_step_by_step():
    # Region servers: plain SGD at lr 1 (delayed Nesterov with N = 1, no momentum), so
    # an update g moves the region model by -g; global server the same; merge 0.5; push
    # after every region update. Worker 0 is region 0, worker 1 region 1.
    s, update = _regions("lr=1.0", "momentum=0.0", "buffer_size=1", "global_lr=1.0",
                         "global_momentum=0.0", "global_buffer_size=1", "merge=0.5",
                         "push_every=1", topology="{us = 1, eu = 1}")
    update(0, 1.0)  # held: the global model does not move
    assert _v(s.params) == 0.0
    assert _v(s.start_of(0)) == -1.0 and _v(s.start_of(1)) == 0.0
    (push0,) = s.take_messages()
    assert (push0.kind, push0.source, push0.destination, push0.nbytes) == ("push", 0, None, 8)
    update(1, 2.0)
    (push1,) = s.take_messages()

    assert _deliver(s, push0) == (-1.0, 0)  # Δ0 = 0 - (-1) = 1 at the global server
    (model0,) = s.take_messages()
    assert (model0.kind, model0.source, model0.destination) == ("model", None, 0)
    update(0, 1.0)  # region 0 goes on while the global model travels
    assert _v(s.start_of(0)) == -2.0 and s.take_messages() == []  # one push at a time

    assert _deliver(s, push1) == (-3.0, 1)  # Δ1 = 2, one global version after r1 merged
    (model1,) = s.take_messages()

    assert _deliver(s, model0) == (-3.0, 1)  # -1 merged into region 0's -2; it moved once
    assert _v(s.start_of(0)) == -1.5
    assert _deliver(s, model1) == (-3.0, 0)  # global -3 into region 1's -2
    assert _v(s.start_of(1)) == -2.5

    update(1, 1.0)  # region 1: -3.5, pushes Δ = -2.5 - (-3.5) = 1
    (push2,) = s.take_messages()
    assert _deliver(s, push2) == (-4.0, 0)  # it had merged the latest global version
    assert s.version == 3


def test_with_k1_alpha1_and_no_global_momentum_the_global_model_follows_the_region():
    s, update = _regions("lr=0.5", "momentum=0.9", "buffer_size=2", "global_lr=1.0",
                         "global_momentum=0.0", "global_buffer_size=1", "merge=1.0",
                         "push_every=1", topology="{us = 2}")
    for i, grad in enumerate([1.0, -0.5, 2.0, 0.25, 1.5]):
        update(i % 2, grad)
        region_now = _v(s.start_of(0))
        (push,) = s.take_messages()
        g, _ = _deliver(s, push)
        assert g == pytest.approx(region_now, abs=1e-12)
        (model,) = s.take_messages()
        _deliver(s, model)
        assert _v(s.start_of(1)) == pytest.approx(g, abs=1e-12)


def test_a_checkpoint_of_an_older_fedlm_loads_into_the_region_servers():
    # older fedlm kept the regions' models and both levels' optimizer states in the
    # strategy's state: they load into the servers, which go on as if never stopped
    s, update = _regions("buffer_size=2", "push_every=1", topology="{us = 1, eu = 1}")
    update(0, 1.0)
    update(1, 0.5)
    (push0, _), state = s.take_messages(), s.state_dict()
    old = {k: state[k] for k in ("models", "merged", "region_version", "merged_version",
                                 "global_version", "global_seen", "dispatched_at",
                                 "next_key", "regions")}
    old.update(region_opt=[p["opt_state"] for p in state["parts"]],
               global_opt=state["global"]["opt_state"], pushes=[0, 0], outbox=[],
               pending={k: {"kind": "push" if m["destination"] is None else "model",
                            "region": m["source"] if m["destination"] is None
                            else m["destination"], "tensors": m["tensors"],
                            "region_version": m["region_version"],
                            "global_version": m["global_version"]}
                        for k, m in state["pending"].items()})
    legacy = {k: state[k] for k in ("params", "version", "seen")} | {"strategy": old}
    b, update_b = _regions("buffer_size=2", "push_every=1", topology="{us = 1, eu = 1}")
    b.load_state_dict(legacy)
    for server, up in ((s, update), (b, update_b)):
        _deliver(server, push0)
        up(0, 0.25)
    assert _v(b.params) == _v(s.params) != 0.0
    assert _v(b.start_of(0)) == _v(s.start_of(0))
    assert [m.key for m in b.take_messages()] == [m.key for m in s.take_messages()]


@pytest.mark.parametrize("bad, says", [
    ("server.merge=0.0", "server.merge: must be in (0, 1]"),
    ("server.merge=1.5", "server.merge: must be in (0, 1]"),
    ("server.push_every=0", "server.push_every: must be >= 1"),
    ("server.push_every=1.5", "server.push_every: expected int"),
    ("server.global_outer={lr = 0.0}", "server.global_outer: the global server's halos: "
                                       "outer.lr: must be > 0"),
    ("server.global_outer={momentum = 1.0}", "outer.momentum: must be in [0, 1)"),
    ("server.global_outer={gamma = 1.0}", "server.global_outer: the global server's halos"),
    ("outer.merge=0.0", "server.merge: must be in (0, 1]"),  # the old spelling, read as new
    ("outer.global_lr=0.0", "outer.lr: must be > 0"),
    ("outer.global_buffer_size=0", "server.global_outer"),
    ("server.pushes=2", "server.pushes: not a setting of server 'regions'"),
    ("server.global_outer={lr = inf}", "server.global_outer.lr: must be a finite number"),
    ("server.global_outer={lr = nan}", "server.global_outer.lr: must be a finite number"),
    ("server.global_outer={buffer_size = 1.5}", "server.global_outer.buffer_size: expected int"),
    ("server.global_outer=3", "server.global_outer: expected a table")])
def test_settings_out_of_range_are_refused(bad, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        tiny_config("strategy=halos", "workers=4", "fleet.topology={us = 2, eu = 2}", bad)


def test_a_setting_given_twice_under_its_two_names_is_refused():
    with pytest.raises(ConfigError, match="server.merge: also given under its old name"):
        tiny_config("strategy=halos", "outer.merge=0.5", "server.merge=0.5")


def test_the_region_servers_settings_come_from_halos_then_the_config():
    cfg = tiny_config("strategy=halos", "workers=4", "fleet.topology={us = 2, eu = 2}",
                      "outer.global_lr=0.5", "server.push_every=8")
    assert cfg.outer == {} and cfg.server.kind == "regions"
    assert cfg.server.settings == {"merge": 0.25, "push_every": 8, "global_outer": {
        "lr": 0.5, "momentum": 0.5, "buffer_size": 2, "c": 0.0}}
    plain = tiny_config("strategy=delayed-nesterov", "server=regions", "workers=4",
                        "fleet.topology={us = 2, eu = 2}")
    assert plain.server.settings == {}  # the kind's defaults: push every version, merge all
    kind = servers.build(plain)
    assert (kind.settings.merge, kind.settings.push_every) == (1.0, 1)


HALOS = ["strategy=halos", "workers=4", "fleet.topology={us = 2, eu = 2}", "updates=10",
         "outer.push_every=2", "outer.buffer_size=2", "outer.lr=0.7"]


def _rows(db, sql):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_one_region_without_pushes_computes_flat_delayed_nesterov_with_dylu(tmp_path):
    # One region whose server never pushes (K beyond the run) is flat DN + DyLU: every
    # job starts from the same model and sends the same outer gradient, in the same order.
    # (The region server's link is the 10 Gbit/s one the flat server has here; no grace
    # window: HALoS has none.)
    common = ["workers=3", "local_steps=dylu", "fleet.preset=moderate", "updates=1000000",
              "local_step_budget=30",
              "outer.lr=0.7", "outer.momentum=0.9", "outer.buffer_size=3", "grace=off",
              "network.intra_bw=1.25e9"]
    run_inprocess(tiny_config(*common, "strategy=delayed-nesterov"), str(tmp_path / "dn.db"))
    run_inprocess(tiny_config(*common, "strategy=halos", "outer.push_every=1000"),
                  str(tmp_path / "h.db"))
    # (halos makes no global version without a push: its jobs' base versions stay 0)
    q = "SELECT worker, staleness, local_steps, update_hash FROM updates ORDER BY op"
    flat, halos = _rows(tmp_path / "dn.db", q), _rows(tmp_path / "h.db", q)
    assert len(flat) >= 9 and flat == halos
    assert _rows(tmp_path / "h.db", "SELECT count(*) FROM transfers") == [(0,)]


@pytest.fixture(scope="module")
def halos_run(tmp_path_factory):
    """One halos run on two regions (us, eu), checkpointing every 3 versions."""
    ref = tmp_path_factory.mktemp("halos") / "ref.db"
    run_inprocess(tiny_config(*HALOS, "reliability.checkpoint_every=3"), str(ref))
    return ref


def test_a_halos_run_replays_and_resumes_bit_identically(tmp_path, halos_run):
    from fedlm.engine import Interrupted

    sets, ref = [*HALOS, "reliability.checkpoint_every=3"], halos_run
    kinds = _rows(ref, "SELECT kind, count(*) FROM transfers GROUP BY kind")
    assert dict(kinds)["push"] >= 3 and dict(kinds)["model"] >= 3  # both levels at work
    result = replay(ref, 1)
    assert result.identical, result

    db, stop = tmp_path / "stopped.db", []
    with pytest.raises(Interrupted):  # stopped mid-run with transfers on their way
        run_inprocess(tiny_config(*sets), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= 5 else None)
    run_inprocess(tiny_config(*sets), str(db), resume=1)
    (a,), (b,) = store.list_runs(ref), store.list_runs(db)
    assert b["status"] == "finished" and a["final_hash"] == b["final_hash"]
    q = "SELECT op, key, kind, region, t_arrived, staleness, version FROM transfers ORDER BY op"
    assert _rows(db, q) == _rows(ref, q)


def test_transfers_are_timed_by_each_regions_link_and_workers_talk_to_their_region(halos_run):
    db = halos_run
    nbytes, = _rows(db, "SELECT DISTINCT bytes FROM transfers")[0]
    # eu's link to the server: 40 ms, 0.5 Gbit/s up, 1 Gbit/s down (fedlm.sim.fleet.REGIONS)
    for kind, bw in (("push", 0.5e9 / 8), ("model", 1e9 / 8)):
        took = _rows(db, f"SELECT t_arrived - t_sent FROM transfers WHERE region=1 AND kind='{kind}'")
        assert took and all(t == pytest.approx(0.040 + nbytes / bw) for (t,) in took)
    # a worker's download is over its region's own link (100 Gbit/s), not the WAN
    down = _rows(db, "SELECT max(t_end - t_start) FROM intervals WHERE kind='download'")[0][0]
    assert down < 0.001 + nbytes / 12.5e9


def test_fedlm_show_gives_each_regions_traffic_with_the_global_server(halos_run):
    from tests._cli import run_cli

    regions = store.region_transfers(halos_run, 1)
    assert [r["region"] for r in regions] == ["us", "eu"]
    pushes = _rows(halos_run, "SELECT region, count(*) FROM transfers WHERE kind='push'"
                              " GROUP BY region ORDER BY region")
    assert [(k, r["pushes"]) for k, r in enumerate(regions)] == pushes
    rc, out, err = run_cli(["show", "1", "--db", str(halos_run)])
    assert rc == 0, err
    assert "messages to and from the server, per region:" in out
    assert any(line.split()[:2] == ["eu", str(regions[1]["pushes"])]
               for line in out.splitlines())


def test_a_short_halos_run_with_the_defaults_trains_its_evaluated_model(tmp_path):
    # HALoS's own K = 32 never pushes in a run this short (about 10 region updates per
    # region), so the global model (the one evaluated) would never move; fedlm's default
    # K lets it train. (A run of `updates` merges always trains: it runs until they happen.)
    db = str(tmp_path / "h.db")
    run_inprocess(tiny_config("strategy=halos", "workers=4", "fleet.topology={us = 2, eu = 2}",
                              "local_steps=dylu", "updates=1000000", "local_step_budget=60"),
                  db)
    assert _rows(db, "SELECT count(*) FROM transfers WHERE kind = 'push'")[0][0] >= 2
    s = store.summarize(db, 1)
    assert s.final_perplexity < s.first_perplexity - 5  # K = 32: equal


def test_the_region_servers_compose_any_asynchronous_strategy(tmp_path):
    # server = "regions" is a kind, not HALoS: delayed Nesterov at every region's server
    # and at the global one (a push every region version, merged whole) trains and replays
    db = tmp_path / "dn.db"
    run_inprocess(tiny_config("strategy=delayed-nesterov", "server=regions", "workers=4",
                              "fleet.topology={us = 2, eu = 2}", "updates=6",
                              "outer.buffer_size=2"), str(db))
    (run,) = store.list_runs(db)
    assert (run["status"], run["updates"]) == ("finished", 6)
    assert _rows(db, "SELECT count(*) FROM transfers WHERE kind = 'push'")[0][0] >= 6
    assert replay(db, 1).identical
