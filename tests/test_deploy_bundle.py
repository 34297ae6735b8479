"""The deployment's app bundle holds the project's own code: never a FIFO (whose read
hung ``flwr run``), a link, a file of another kind, or anything under the deployment's
home (its credentials.yaml holds the live owner token). The real deployments of
tests/test_deploy.py run from such a bundle."""

import os
from pathlib import Path

from fedlm.deploy import bundle

ROOT = Path(__file__).resolve().parent.parent


def _project(tmp_path) -> Path:
    root = tmp_path / "project"
    (root / "fedlm" / "engine").mkdir(parents=True)
    (root / "strategies").mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'fedlm'\n")
    (root / "fedlm" / "__init__.py").write_text("")
    (root / "fedlm" / "engine" / "loop.py").write_text("x = 1\n")
    (root / "strategies" / "base.py").write_text("y = 2\n")
    return root


def test_only_the_projects_python_files_and_pyproject_are_bundled(tmp_path):
    root = _project(tmp_path)
    os.mkfifo(root / "fedlm" / "engine" / "jam.py")  # a read of it never returns
    (root / "fedlm" / "secret.py").symlink_to("/etc/hostname")
    (root / "fedlm" / "notes.txt").write_text("not code")
    (root / "runs").mkdir()
    (root / "runs" / "fedlm.db").write_text("a store")
    home = root / "fedlm" / "deploy-home"  # a --home inside the project, even in a package
    home.mkdir()
    (home / "credentials.yaml").write_text("token: live")
    (home / "leak.py").write_text("token = 'live'\n")
    got = {str(p) for p in bundle.project_files(root, home)}
    assert got == {"pyproject.toml", "fedlm/__init__.py", "fedlm/engine/loop.py",
                   "strategies/base.py"}
    staged = bundle.stage(root, tmp_path / "app", home)
    assert sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()) \
        == sorted(got)
    assert (staged / "fedlm" / "engine" / "loop.py").read_text() == "x = 1\n"


def test_the_real_project_bundles_its_packages_and_no_test_or_run():
    files = {str(p) for p in bundle.project_files(ROOT)}
    assert "fedlm/flower/client_app.py" in files and "strategies/registry.py" in files
    assert "dashboard/app.py" in files and "pyproject.toml" in files
    assert not any(f.startswith(("tests/", "runs/", "experiments/", ".git")) for f in files)
