"""One assembly (issue 60): a run builds its strategy once, from the config check's trial
to the engine, and every engine is made by ``fedlm.engine.assembly.assemble`` (the
architecture test in tests/test_server_protocol.py checks that no other code calls
``Engine(``)."""

from __future__ import annotations

import sys

from fedlm import cli, store

COUNTING = '''
from fedlm.strategies.diloco import DiLoCo

BUILT = []

class Counted(DiLoCo):
    def __init__(self, **settings):
        BUILT.append(settings)
        super().__init__(**settings)
'''


def test_fedlm_run_builds_its_strategy_once(tmp_path, monkeypatch):
    """It was built three times: the config check's trial, the announcement, the run."""
    (tmp_path / "counted.py").write_text(COUNTING)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        rc = cli.main(["run", "--backend", "inprocess", "--quiet", "--db", "r.db",
                       "--set", "model=tiny", "--set", "workers=2", "--set", "updates=1",
                       "--set", "inner.steps=2", "--set", "eval.batches=1",
                       "--set", "strategy=counted:Counted", "--set", "outer.lr=0.5"])
        assert rc == 0 and store.list_runs("r.db")[0]["status"] == "finished"
        assert sys.modules["counted"].BUILT == [{"lr": 0.5}]
    finally:
        sys.modules.pop("counted", None)


def test_a_second_config_of_other_settings_gets_a_strategy_of_its_own(tmp_path):
    """The check's trial goes only to a run of the same settings, once."""
    from fedlm import config_load, servers

    a = config_load.load(None, ["model=tiny", "outer.lr=0.5"])
    b = config_load.load(None, ["model=tiny", "outer.lr=0.25"])
    built_b = servers.build(b).strategy
    assert built_b.lr == 0.25
    first, second = servers.build(a).strategy, servers.build(a).strategy
    assert first.lr == second.lr == 0.5 and first is not second
