"""Plug-in code that blocks is bounded in wall-clock time (reliability.hook_timeout):
a strategy hook that sleeps or spins for ever ends the run, failed, in one line naming
the hook, in seconds; in the main thread (the in-process backend) and in another one
(Flower's ServerApp thread)."""

import os
import subprocess
import sys
import threading
import time

import pytest

from fedlm import config_load
from fedlm.errors import ConfigError
from fedlm.servers.watch import HookTimeout, HookWatch, Watched

PLUGIN = '''
import time
from fedlm.strategies.delayed_nesterov import DelayedNesterov

class SleepsForEver(DelayedNesterov):
    def on_update(self, update, params):
        time.sleep(1e6)
'''


def test_a_sleep_in_the_main_thread_is_cut_short():
    watch = HookWatch(0.5)
    start = time.monotonic()
    with watch.armed(), pytest.raises(HookTimeout, match=r"^sleeper did not return within 0.5 s"):
        watch.run("sleeper", time.sleep, 60)
    assert time.monotonic() - start < 5


def test_a_spin_in_another_thread_is_cut_short():
    watch, caught = HookWatch(0.5), []

    def spin():
        try:
            watch.run("spinner", lambda: [None for _ in iter(int, 1)])
        except HookTimeout as exc:
            caught.append(str(exc))

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive() and caught and caught[0].startswith("spinner did not return")


def test_calls_that_return_in_time_are_untouched_and_a_nested_call_is_the_outer_s():
    watch = HookWatch(2.0)
    with watch.armed():
        assert watch.run("outer", lambda: watch.run("inner", lambda: 7)) == 7
        for _ in range(1000):
            watch.run("quick", int)
    assert HookWatch(0).run("unbounded", lambda: 3) == 3


def test_the_proxy_names_the_server_kind_and_its_strategy():
    class Kind:
        strategy = type("MyStrategy", (), {})()
        keeps = True

        def take(self):
            time.sleep(60)

    watch = HookWatch(0.3)
    proxy = Watched(Kind(), watch)
    assert proxy.keeps is True  # a field reads as it is
    with watch.armed(), pytest.raises(HookTimeout, match=r"Kind\.take \(strategy MyStrategy\)"):
        proxy.take()


def test_the_bound_is_checked_like_every_setting():
    with pytest.raises(ConfigError, match="reliability.hook_timeout: must be 0 "):
        config_load.load(None, ["reliability.hook_timeout=-1"])


def test_a_run_whose_strategy_sleeps_for_ever_fails_in_seconds_naming_the_hook(tmp_path):
    (tmp_path / "sleepy_plugin.py").write_text(PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "fedlm", "run", "--backend", "inprocess", "--quiet",
           "--db", str(tmp_path / "h.db")]
    for kv in ("model=tiny", "workers=2", "updates=2", "inner.steps=2", "data.seq_len=64",
               "eval.batches=1", "strategy=sleepy_plugin:SleepsForEver",
               "reliability.hook_timeout=2"):
        cmd += ["--set", kv]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env,
                         cwd=tmp_path)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == ("fedlm: error: run 1 failed: HookTimeout: Server.take (strategy "
                    "SleepsForEver) did not return within 2 s (reliability.hook_timeout; "
                    "plug-in code that blocks?)")
    assert "Traceback" not in out.stderr
    assert time.monotonic() - start < 120
    from fedlm import store
    assert [r["status"] for r in store.list_runs(tmp_path / "h.db")] == ["failed"]


SLOW_AT_LOAD = '''
import time
from fedlm.strategies.diloco import DiLoCo

class SleepsInInit(DiLoCo):
    def __init__(self, **kw):
        time.sleep(1e6)

def sleepy_factory(named_params, inner):
    time.sleep(1e6)
'''


@pytest.mark.parametrize("setting, message", [
    ("strategy=slow_load:SleepsInInit", "fedlm: error: strategy: cannot load "
                                        "'slow_load:SleepsInInit' (HookTimeout: loading the "
                                        "config's plug-in code"),
    ("inner.optimizer=slow_load:sleepy_factory", "fedlm: error: reliability.hook_timeout: "
                                                 "inner.optimizer slow_load:sleepy_factory did "
                                                 "not return within 2 s"),
])
def test_plug_in_code_run_before_the_run_is_bounded_too(tmp_path, setting, message):
    """A strategy constructor or an optimizer factory that sleeps ran unbounded, whatever
    reliability.hook_timeout said, with nothing printed."""
    (tmp_path / "slow_load.py").write_text(SLOW_AT_LOAD)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "fedlm", "run", "--backend", "inprocess", "--quiet",
           "--db", str(tmp_path / "h.db"), "--set", "model=tiny", "--set", setting,
           "--set", "reliability.hook_timeout=2"]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path)
    assert time.monotonic() - start < 60
    assert out.returncode == 2 and out.stderr.startswith(message), out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "h.db").exists()  # refused before a run is stored


@pytest.mark.parametrize("limit", ["1e-308", "0.5"])
def test_a_bound_that_would_cut_fedlms_own_hooks_is_refused(limit):
    with pytest.raises(ConfigError, match=r"^reliability.hook_timeout: must be 0 \(no bound\) "
                                          r"or at least 1 s"):
        config_load.load(None, [f"reliability.hook_timeout={limit}"])


def test_a_built_in_hook_past_its_bound_is_not_blamed_on_plug_in_code():
    from fedlm.servers import Server

    class Builtin(Server):  # as fedlm's own: its module is fedlm's
        def take(self):
            time.sleep(60)

    Builtin.__module__ = "fedlm.servers.protocol"
    kind = Builtin.__new__(Builtin)
    kind.strategy = None
    watch = HookWatch(0.3)
    with watch.armed(), pytest.raises(HookTimeout, match=r"fedlm's own code: a bound this "
                                                         r"short cuts ordinary work"):
        Watched(kind, watch).take()


@pytest.mark.flower
def test_a_hook_blocked_in_c_on_flowers_thread_ends_the_run_in_bounded_time(tmp_path):
    """On Flower's backend the engine runs in the ServerApp's thread, where a sleep inside
    C cannot be cut: the run went on for the whole sleep (240 s), then Ctrl-C printed
    Flower's tracebacks and "run failed" while the store said running. Now the main
    thread ends the command, in one line, and the store says how the run ended."""
    (tmp_path / "sleepy_plugin.py").write_text(PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "fedlm", "run", "--quiet", "--db", str(tmp_path / "h.db")]
    for kv in ("model=tiny", "workers=2", "updates=2", "inner.steps=2", "data.seq_len=64",
               "eval.batches=1", "strategy=sleepy_plugin:SleepsForEver",
               "reliability.hook_timeout=2"):
        cmd += ["--set", kv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env,
                         cwd=tmp_path)
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["fedlm: error: run 1 failed: HookTimeout: Server.take (strategy "
                      "SleepsForEver) did not return within 2 s (reliability.hook_timeout; "
                      "plug-in code that blocks?); the call is blocked inside C, the run "
                      "ends without it"], out.stderr
    assert "Traceback" not in out.stderr
    from fedlm import store
    runs = store.list_runs(tmp_path / "h.db")
    assert [r["status"] for r in runs] == ["failed"] and "blocked inside C" in runs[0]["error"]
