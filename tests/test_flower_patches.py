"""fedlm.flower.patches: every change to Flower's or Ray's behaviour is applied only when
called, once, on a tested version only (else refused, naming its switch), and says
what it changed; no other module of ours patches Flower or Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from fedlm.flower import patches

ROOT = Path(__file__).resolve().parent.parent


def _targets() -> dict[str, object]:
    """What each patch replaces, as Flower and Ray define it now: "module.attr" -> object."""
    import importlib

    out = {}
    for module, attrs in patches.PULL_TARGETS.items():
        for attr in attrs:
            out[f"{module}.{attr}"] = getattr(importlib.import_module(module), attr)
    from flwr.supernode import start_client_internal
    import ray._private.utils

    out["flwr.supernode.start_client_internal.time"] = start_client_internal.time
    out["ray._private.utils.set_sigterm_handler"] = ray._private.utils.set_sigterm_handler
    for module in patches.AUTHN_TARGETS:
        out[f"{module}.load_control_authn_plugin"] = \
            importlib.import_module(module).load_control_authn_plugin
    return out


CALLS = {"supernode-waits": patches.supernode_waits, "pull-backoff": patches.pull_backoff,
         "ray-sigterm": patches.ray_keeps_sigterm,
         "owner-token": lambda: patches.owner_token("t" * 43)}


def test_importing_fedlm_patches_nothing():
    # a fresh interpreter imports every module that uses a patch, then looks at Flower
    # and Ray: all is as they define it (a patch applied at import would show here)
    code = (
        "import importlib, sys, time\n"
        "for m in ['fedlm.flower.patches', 'fedlm.deploy.supernode', 'fedlm.deploy.warm_executor',"
        " 'fedlm.deploy.local', 'fedlm.deploy.superlink', 'fedlm.flower.server_app',"
        " 'fedlm.flower.simulation', 'fedlm.flower.client_app', 'fedlm.cli']:\n"
        "    importlib.import_module(m)\n"
        "from fedlm.flower import patches\n"
        "from flwr.supercore.inflatable import inflatable_utils as u\n"
        "for mod, attrs in patches.PULL_TARGETS.items():\n"
        "    for a in attrs:\n"
        "        assert getattr(importlib.import_module(mod), a) is getattr(u, a), (mod, a)\n"
        "from flwr.supernode import start_client_internal as loop\n"
        "assert loop.time is time, loop.time\n"
        "import ray._private.utils as r\n"
        "assert not hasattr(r.set_sigterm_handler, patches.MARK)\n"
        "from flwr.superlink import config_loader as c\n"
        "for mod in patches.AUTHN_TARGETS:\n"
        "    loader = importlib.import_module(mod).load_control_authn_plugin\n"
        "    assert loader is c.load_control_authn_plugin, mod\n"
        "print('untouched')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=240, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "untouched", out.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_patch_applies_once_says_what_it_did_and_undoes(name):
    before = _targets()
    first = CALLS[name]()
    try:
        assert first.changed and first.name == name
        assert all(before[t] is not _targets()[t] for t in first.changed)
        assert set(_targets()) == set(before)
        assert first.describe().startswith(f"fedlm patch {name} (") and first.changed[0] in \
            first.describe()
        after_first = _targets()
        second = CALLS[name]()
        assert second.changed == [] and second.note == "already applied"
        assert all(after_first[t] is v for t, v in _targets().items())  # not wrapped twice
    finally:
        first.undo()
    assert all(before[t] is v for t, v in _targets().items())


def test_the_patches_change_what_they_say():
    from flwr.supernode import start_client_internal as loop

    waits = patches.supernode_waits()
    pulls = patches.pull_backoff("flwr.superlink.grid.http_grid")
    try:
        t0 = time.monotonic()
        loop.time.sleep(3)  # Flower's sleep after an empty poll
        assert time.monotonic() - t0 < 1.0
        assert loop.time.monotonic() > 0  # the rest of the time module is untouched
        from flwr.superlink.grid import http_grid

        assert http_grid.pull_objects.keywords["initial_backoff"] == patches.INITIAL_BACKOFF_S
        assert pulls.changed == ["flwr.superlink.grid.http_grid.pull_objects"]
    finally:
        pulls.undo()
        waits.undo()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_an_untested_version_is_refused_naming_the_switch(name, monkeypatch):
    before = _targets()
    monkeypatch.setattr(patches, "installed", lambda package: "0.0.1")
    with pytest.raises(patches.UnsupportedVersion) as err:
        CALLS[name]()
    message = str(err.value)
    assert "\n" not in message and f"{patches.PATCHES[name].switch}=0" in message
    assert "0.0.1" in message
    assert all(before[t] is v for t, v in _targets().items())  # nothing was changed


def test_the_warm_executor_is_refused_on_an_untested_flower(monkeypatch, tmp_path):
    monkeypatch.setattr(patches, "installed", lambda package: "0.0.1")
    with pytest.raises(patches.UnsupportedVersion, match="FEDLM_PATCH_WARM_EXECUTOR=0"):
        patches.superexec_auth_methods()
    from fedlm.deploy.local import LocalDeployment

    with pytest.raises(patches.UnsupportedVersion, match="FEDLM_PATCH_WARM_EXECUTOR=0"):
        LocalDeployment(tmp_path, 1, warm_exec=True)
    # switched off: the deployment runs Flower's own SuperExec, on any version
    monkeypatch.setenv("FEDLM_PATCH_WARM_EXECUTOR", "0")
    monkeypatch.setenv("FEDLM_PATCH_OWNER_TOKEN", "0")
    assert LocalDeployment(tmp_path, 1).warm_exec is False


def test_the_owner_token_is_refused_on_an_untested_flower(monkeypatch, tmp_path):
    from fedlm.deploy.local import LocalDeployment

    monkeypatch.setattr(patches, "installed", lambda package: "0.0.1")
    monkeypatch.setenv("FEDLM_PATCH_WARM_EXECUTOR", "0")
    with pytest.raises(patches.UnsupportedVersion, match="FEDLM_PATCH_OWNER_TOKEN=0"):
        LocalDeployment(tmp_path, 1)  # refused before anything starts
    # switched off: Flower's SuperLink as it comes (anyone may use its Control API)
    monkeypatch.setenv("FEDLM_PATCH_OWNER_TOKEN", "0")
    assert LocalDeployment(tmp_path, 1).owner_token is False


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_switched_off_patch_changes_nothing_on_any_version(name, monkeypatch):
    before = _targets()
    monkeypatch.setattr(patches, "installed", lambda package: "0.0.1")
    monkeypatch.setenv(patches.PATCHES[name].switch, "0")
    done = CALLS[name]()
    assert done.changed == [] and f"{patches.PATCHES[name].switch}=0" in done.describe()
    assert all(before[t] is v for t, v in _targets().items())


def test_an_old_setting_name_is_not_silently_ignored(monkeypatch):
    monkeypatch.setenv("FEDLM_WARM_EXECUTOR", "0")
    with pytest.warns(UserWarning, match="FEDLM_PATCH_WARM_EXECUTOR"):
        patches.enabled("warm-executor")


def test_the_installed_versions_are_tested_and_allowed_by_pyproject():
    from packaging.requirements import Requirement

    assert patches.installed("flwr") in patches.TESTED["flwr"]
    assert patches.installed("ray") in patches.TESTED["ray"]
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (flwr,) = [Requirement(d) for d in deps if Requirement(d).name == "flwr"]
    assert flwr.specifier.contains(patches.installed("flwr"))
    assert all(v in patches.TESTED["flwr"] for v in flwr.specifier.filter(
        [f"1.{minor}.0" for minor in range(30, 60)]))  # the pin allows no untested series


def test_the_docs_table_names_every_switch():
    text = (ROOT / "docs" / "deployment.md").read_text()
    for patch in patches.PATCHES.values():
        assert f"`{patch.switch}`" in text, patch.switch
    for value in ("FEDLM_PATCH_SUPERNODE_WAITS_S", "FEDLM_PATCH_WARM_EXECUTOR_POLL_S"):
        assert f"`{value}`" in text


def _flower_module_names(tree: ast.Module) -> set[str]:
    """Names bound to Flower or Ray modules (or their attributes) by imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.split(".")[0] in ("flwr", "ray")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in \
                ("flwr", "ray"):
            names |= {a.asname or a.name for a in node.names}
    return names


def test_no_other_module_of_ours_changes_flower_or_ray():
    found = []
    for path in sorted((ROOT / "fedlm").rglob("*.py")):
        if path.name == "patches.py" or "__pycache__" in path.parts:
            continue
        text = path.read_text()
        tree = ast.parse(text)
        flower = _flower_module_names(tree)
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                root = t
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(t, ast.Attribute) and isinstance(root, ast.Name) and \
                        root.id in flower:
                    found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in flower:
                found.append(f"{path.name}:{node.lineno}")
        for private in ("_SUPEREXEC_AUTH_METHODS", "ray._private"):
            if private in text:
                found.append(f"{path.name}: {private}")
    assert found == []
