"""Families fedlm's core does not have, as plug-ins outside fedlm/ and strategies/
(examples/): each strategy suggests its own server kind (``default_server``, which the
config takes), its rule is pinned step by step on a toy, and its runs replay and
resume bit for bit."""

from pathlib import Path

import pytest

from fedlm import store
from fedlm.replay import replay
from fedlm.runner import run_inprocess
from tests.conftest import tiny_config
from tests.support import play_round, scalar as _p, scalar_update as _update, value as _v

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_noloco_merges_each_pair_by_its_modified_nesterov_step():
    from noloco_example import NoLoCo, groups

    s = NoLoCo(lr=0.5, momentum=0.9, gamma=0.25)
    s.start(_p(1.0), num_workers=4)
    phi = [_p(1.0)] * 4  # the workers' slow models (its server's, PeerServer)
    (a, b), (c, d) = groups(0, [0, 1, 2, 3])  # a seeded shuffle, paired in order
    assert s.on_update(_update(a, 0.2), phi) is None  # its peer has not reported
    assert not s.wants_job(a, version=0) and s.wants_job(b, version=0)
    phi = s.on_update(_update(b, 0.6), phi)  # the pair merges: m = -0.5·0.4 - 0.25·0
    assert _v(phi[a]) == _v(phi[b]) == pytest.approx(1.0 - 0.2)
    assert _v(phi[c]) == _v(phi[d]) == 1.0
    assert s.round[a] == s.round[b] == 1 and s.round[c] == s.round[d] == 0
    # round 1: the pulling term -γ(φ_j - mean φ) shows once the pair's φ differ
    phi[a], phi[b] = _p(0.8), _p(0.4)
    s.mom[a], s.mom[b] = _p(-0.2), _p(-0.2)
    group = next(g for g in groups(1, [0, 1, 2, 3]) if a in g)
    peer = next(w for w in group if w != a)
    phi[peer], s.mom[peer], s.round[peer] = _p(0.4), _p(-0.2), 1
    assert s.on_update(_update(a, 0.1), phi) is None
    phi = s.on_update(_update(peer, 0.3), phi)
    # m_a = 0.9·(-0.2) - 0.5·0.2 - 0.25·(0.8 - 0.6) = -0.33;  φ_a = 0.8 - 0.33
    assert _v(s.mom[a]) == pytest.approx(-0.33) and _v(phi[a]) == pytest.approx(0.47)
    # m_peer = -0.18 - 0.1 - 0.25·(0.4 - 0.6) = -0.23;  φ_peer = 0.4 - 0.23
    assert _v(s.mom[peer]) == pytest.approx(-0.23) and _v(phi[peer]) == pytest.approx(0.17)


def test_noloco_s_server_keeps_the_slow_models_and_evaluates_their_mean():
    from fedlm import servers
    from fedlm.sim import fleet
    from fedlm.strategies import registry
    from noloco_example import PeerServer, groups

    cfg = tiny_config(*NOLOCO, "outer.lr=0.5", "outer.momentum=0.9", "outer.gamma=0.25")
    server = servers.build(cfg, registry.build_strategy(cfg.strategy, cfg.outer))
    assert isinstance(server, PeerServer)
    server.start(_p(1.0), fleet.node_profiles(cfg))
    (a, b), _ = groups(0, [0, 1, 2, 3])
    assert server.take(_update(a, 0.2)) is None
    mean = server.take(_update(b, 0.6))
    assert _v(server.start_of(a)) == _v(server.start_of(b)) == pytest.approx(0.8)
    assert _v(mean) == pytest.approx((2 * 0.8 + 2 * 1.0) / 4)  # evaluated: mean of φ


def test_noloco_lost_jobs_and_retired_workers_never_strand_a_peer():
    from noloco_example import NoLoCo, groups

    s = NoLoCo(lr=1.0, momentum=0.0, gamma=0.0)
    s.start(_p(1.0), num_workers=2)
    phi = [_p(1.0)] * 2
    (a, b), = groups(0, [0, 1])
    s.on_update(_update(a, 0.4), phi)
    phi = s.on_job_lost(b, job_id=1, reason="error", params=phi)  # b counts as g = 0
    assert _v(phi[a]) == _v(phi[b]) == pytest.approx(0.8)
    s.on_update(_update(a, 0.2), phi)
    phi = s.on_job_lost(b, job_id=2, reason="retired", params=phi)  # a merges alone
    assert _v(phi[a]) == pytest.approx(0.6) and _v(phi[b]) == pytest.approx(0.8)
    assert not s.wants_job(b, version=0) and s.wants_job(a, version=0)


NOLOCO = ["strategy=noloco_example:NoLoCo", "workers=4", "updates=5", "eval.every=2"]


def test_a_noloco_run_trains_replays_and_resumes_bit_identically(tmp_path):
    from fedlm.engine import Interrupted

    sets = [*NOLOCO, "reliability.checkpoint_every=3"]
    ref = tmp_path / "ref.db"
    run_inprocess(tiny_config(*sets), str(ref))
    (run,) = store.list_runs(ref)
    s = store.summarize(ref, 1)
    assert run["status"] == "finished" and s.updates == 10  # 5 rounds of 2 pairs
    assert s.final_perplexity < s.first_perplexity - 5
    assert replay(ref, 1).identical

    db, stop = tmp_path / "stopped.db", []
    with pytest.raises(Interrupted):
        run_inprocess(tiny_config(*sets), str(db), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= 7 else None)
    run_inprocess(tiny_config(*sets), str(db), resume=1)
    (b,) = store.list_runs(db)
    assert b["status"] == "finished" and b["final_hash"] == run["final_hash"]


def test_the_docs_table_is_the_one_list_of_the_examples():
    """docs/strategies.md's table of examples/ names every file there, and no other."""
    import re

    page = (ROOT / "docs" / "strategies.md").read_text()
    table = page.split("## The plug-ins in `examples/`")[1].split("\n\n```")[0]
    listed = set(re.findall(r"^\| `(\w+)\.py` \|", table, flags=re.M))
    assert listed == {p.stem for p in (ROOT / "examples").glob("*.py")}


def test_no_core_file_imports_an_example():
    """The plug-ins live in examples/ and come in by dotted path only: no module of the
    core (fedlm/, strategies/) imports one, whatever the history (the tree is read)."""
    import ast

    examples = {p.stem for p in (ROOT / "examples").glob("*.py")}
    found = []
    for folder in ("fedlm", "strategies"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                found += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.split(".")[0] in examples or n.startswith("examples")]
    assert examples and found == []


def test_the_overlapped_outer_step_is_diloco_on_each_gradient_moved_by_dc_asgd():
    from fedlm.strategies.diloco import DiLoCo
    from overlap_dc_example import OverlappedDiLoCo

    s, ref = OverlappedDiLoCo(compensation=2.0), DiLoCo()
    x0 = _p(1.0)
    s.start(x0, num_workers=2)
    ref.start(x0, num_workers=2)
    x1 = play_round(s, {0: 0.2, 1: 0.4}, x0)  # round 0: nothing to compensate
    assert _v(x1) == _v(play_round(ref, {0: 0.2, 1: 0.4}, x0))
    x2 = play_round(s, {0: 0.1, 1: 0.3}, x1)  # taken at x0, applied to x1
    drift, v = _v(x1) - 1.0, 0.95 * 0.1 + 0.05 * 0.05  # v: (0.04+0.16)/2, then (0.01+0.09)/2
    moved = {w: g + 2.0 * g * g * drift / v ** 0.5 for w, g in {0: 0.1, 1: 0.3}.items()}
    assert _v(x2) == pytest.approx(_v(play_round(ref, moved, x1)), rel=1e-12)
    assert moved[1] < 0.3  # x moved the way this gradient points: less of it is left


OVERLAP = ["strategy=overlap_dc_example:OverlappedDiLoCo", "profile=geo", "workers=4",
           "updates=4", "inner.steps=6"]


def test_an_overlapped_run_starts_each_round_from_the_version_before_and_hides_its_exchange(
        tmp_path):
    import sqlite3

    db = tmp_path / "o.db"
    run_inprocess(tiny_config(*OVERLAP, "reliability.checkpoint_every=2"), str(db))
    run_inprocess(tiny_config(*OVERLAP[1:], "strategy=diloco"), str(tmp_path / "d.db"))
    with sqlite3.connect(db) as conn:
        kinds = dict(conn.execute("SELECT kind, count(*) FROM intervals GROUP BY kind"))
    # a worker's first job waits for its download; every later one's exchange runs behind
    assert kinds["exchange"] == 4 and kinds["hidden exchange"] == 4 * 3
    assert "download" not in kinds and "upload" not in kinds
    (o,), (d,) = store.list_runs(db), store.list_runs(tmp_path / "d.db")
    assert o["virtual_time"] < d["virtual_time"]  # later exchanges run behind compute
    assert replay(db, 1).identical
    from fedlm.engine import Interrupted

    cut, stop = tmp_path / "stopped.db", []
    sets = [*OVERLAP, "reliability.checkpoint_every=2"]
    with pytest.raises(Interrupted):  # stopped mid-run: the server's previous version kept
        run_inprocess(tiny_config(*sets), str(cut), should_stop=lambda: bool(stop),
                      progress=lambda p: stop.append(1) if p.version >= 3 else None)
    run_inprocess(tiny_config(*sets), str(cut), resume=1)
    (b,) = store.list_runs(cut)
    assert b["status"] == "finished" and b["final_hash"] == o["final_hash"]


def test_a_server_that_times_its_own_jobs_is_refused_a_shared_link(monkeypatch):
    # a shared server link times every job by its flows: the overlapped server's own
    # timing would silently disappear there (it did before this check)
    from fedlm.config_load import ConfigError
    from tests.conftest import tiny_config

    monkeypatch.syspath_prepend(str(EXAMPLES))
    for key in ("network.server_up=3e6", "network.server_down=3e6",
                "network.daily_amplitude=0.3"):
        with pytest.raises(ConfigError, match=r"server times its own jobs \(OverlappedServer"
                                              r"\.timing\), which a shared server link cannot"):
            tiny_config("strategy=overlap_dc_example:OverlappedDiLoCo", key)
    assert tiny_config("strategy=overlap_dc_example:OverlappedDiLoCo")  # no shared link: fine


def test_a_kind_that_declares_what_it_serves_the_old_way_is_told_how(tmp_path, monkeypatch):
    """What a kind serves is one record (``serves = Serves(...)``); the class attributes it
    replaced would be read by nothing: refused in one line with the new spelling."""
    from fedlm.config_load import ConfigError
    from tests.conftest import tiny_config

    (tmp_path / "old_kind.py").write_text(
        "from fedlm.servers import Server\n"
        "class Old(Server):\n    keeps_job_starts = True\n    drains_messages = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^server: declares what it serves in class "
                                          r"attributes \(keeps_job_starts, drains_messages\), "
                                          r"which fedlm no longer reads: declare serves = "):
        tiny_config("server=old_kind:Old")
