"""Our modules import on their own, in any order, and without cycles.

Three checks:

- static: the graph of module-level imports between our modules (``fedlm``,
  ``strategies``, ``dashboard``; parsed with ``ast``; imports inside functions and
  under ``if TYPE_CHECKING:`` do not count) has no cycle. A cycle here works only
  while every caller happens to import the modules in the right order. Counting the
  imports inside functions too, there is none either: those are for speed only;
- dynamic: every module imports in a fresh interpreter (so none relies on another
  having been imported first);
- loading a config does not import torch (``fedlm config`` and config checks stay
  fast: the schema, the loader, the presets and the strategy registry are torch-free).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fedlm", "strategies", "dashboard")
# Scripts: importing them runs them (the CLI; the Streamlit app). Their imports are in
# the static graph; the CLI and dashboard tests run them for real.
SCRIPTS = {"fedlm.__main__", "fedlm.cli.__main__", "fedlm.dashboard.app"}
IMPORT_TIMEOUT = 180  # seconds for one cold import (torch on a busy machine takes a few)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "fedlm":  # strategies/, dashboard/ install as fedlm.strategies, ...
        parts.insert(0, "fedlm")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def our_modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of our packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[_module_name(path)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(tree: ast.Module):
    """Import statements that run when the module is imported: not inside a function,
    not under ``if TYPE_CHECKING:`` (its ``else:`` does run)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(child for child in ast.iter_child_nodes(node)
                        if isinstance(child, ast.stmt))


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             known: set[str]) -> set[str]:
    """Our modules that ``node``, in ``module``, imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:  # relative: from . import x, from ..a import b
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = set()
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in known:  # from package import submodule
            out.add(sub)
        elif source in known:  # from module import name
            out.add(source)
    return out


def import_graph(deferred: bool = False) -> dict[str, set[str]]:
    """Module -> our modules it imports at module level (``deferred``: anywhere,
    imports inside functions too)."""
    modules = our_modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        nodes = (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))) \
            if deferred else _module_level_imports(tree)
        graph[name] = set()
        for node in nodes:
            graph[name] |= _targets(name, is_package, node, known)
        graph[name].discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module
    (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [_one_cycle(graph, set(c)) for c in components]


def _one_cycle(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """A path a -> ... -> a inside one strongly connected component (for the message)."""
    start = min(members)
    parents, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child not in parents:
                    parents[child] = node
                    nxt.append(child)
        frontier = nxt
    return sorted(members)


def test_the_cycle_finder_finds_cycles_and_only_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    found = cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}, "e": {"a", "c"}})
    assert sorted(found) == [["a", "b", "a"], ["c", "d", "c"]]


def test_the_graph_reads_module_level_imports_only():
    tree = ast.parse("import fedlm.sim.fleet\nfrom fedlm import config, errors\n"
                     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from fedlm import model\nelse:\n    from fedlm import data\n"
                     "try:\n    from fedlm.strategies.registry import STRATEGIES\n"
                     "except ImportError:\n    pass\n"
                     "def f():\n    from fedlm import engine\n"
                     "class C:\n    def g(self):\n        import fedlm.store\n")
    known = {"fedlm", "fedlm.sim.fleet", "fedlm.config", "fedlm.errors", "fedlm.model",
             "fedlm.data", "fedlm.engine", "fedlm.store", "fedlm.strategies.registry"}
    found = set()
    for node in _module_level_imports(tree):
        found |= _targets("fedlm.x", False, node, known)
    assert found == {"fedlm.sim.fleet", "fedlm.config", "fedlm.errors", "fedlm.data",
                     "fedlm.strategies.registry"}
    relative = ast.parse("from . import config\nfrom .errors import ConfigError\n")
    found = set()
    for node in _module_level_imports(relative):
        found |= _targets("fedlm.x", False, node, known)
    assert found == {"fedlm.config", "fedlm.errors"}


def test_no_import_cycle_between_our_modules():
    graph = import_graph()
    assert {"fedlm.config", "fedlm.config_check", "fedlm.strategies.registry"} <= set(graph)
    assert {"fedlm.config", "fedlm.strategies.registry"} <= graph["fedlm.config_check"]  # real edges
    found = cycles(graph)
    assert found == [], "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_no_import_inside_a_function_closes_a_cycle():
    # Deferred imports are for speed (torch, Flower, datasets only where needed), never
    # to dodge a cycle: counting them too, the graph still has none.
    found = cycles(import_graph(deferred=True))
    assert found == [], "cycles through deferred imports: " + "; ".join(
        " -> ".join(c) for c in found)


def test_the_schema_imports_only_the_standard_library_and_errors():
    assert import_graph()["fedlm.config"] == {"fedlm.errors", "fedlm.config.choices",
                                              "fedlm.config.server"}
    assert import_graph()["fedlm.config.choices"] == set()
    assert import_graph()["fedlm.config.server"] == set()
    assert import_graph()["fedlm.config.values"] == {"fedlm.errors"}
    assert import_graph()["fedlm.errors"] == set()


# One fresh interpreter loads torch (what most of fedlm's rooms import, and by far the
# longest part of a cold import: ~1.5 s) and nothing of fedlm, then forks a child per
# module: each child imports its module alone, from a fedlm-free state. Before, each
# module had a fresh interpreter of its own (110 cold torch imports: ~60 s of the suite).
_ZYGOTE = r"""
import importlib, json, os, sys
import torch  # noqa: F401
assert not any(m == "fedlm" or m.startswith("fedlm.") for m in sys.modules)
failed = {}
for module in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(module)
            code, text = 0, ""
        except BaseException as exc:
            code, text = 1, f"{type(exc).__name__}: {exc}".splitlines()[0]
        os.write(w, text.encode()[:2000])
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        text = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed[module] = text or f"exit status {status}"
print(json.dumps(failed))
"""


def test_every_module_imports_alone_in_a_fresh_interpreter():
    modules = sorted(set(our_modules()) - SCRIPTS)
    proc = subprocess.run([sys.executable, "-c", _ZYGOTE, *modules], capture_output=True,
                          text=True, timeout=IMPORT_TIMEOUT * 3, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{m}: {err}" for m, err in failed.items())


@pytest.mark.parametrize("code", [
    "from fedlm import config_load; config_load.load(None, [])",
    "from fedlm import config_load; config_load.load(None, ['strategy=delayed-nesterov', "
    "'model=150m', 'profile=geo', 'network.hierarchical=true'])",
    "from fedlm.strategies import registry; registry.build_strategy('fedbuff', {})",
])
def test_loading_a_config_does_not_import_torch(code):
    assert _loaded_after(code, {"torch"}) == []


def test_the_command_line_loads_without_torch():
    # `fedlm runs`, `show` and usage errors answer at once (fedlm.cli): each command
    # imports torch, where it needs it, when it runs
    assert _loaded_after("import fedlm.cli; fedlm.cli.build_parser()", {"torch"}) == []


def _loaded_after(code: str, packages: set[str]) -> list[str]:
    """Which of ``packages`` a fresh interpreter has imported after running ``code``."""
    proc = subprocess.run([sys.executable, "-c", f"{code}; import sys; print(sorted("
                           f"{{m.split('.')[0] for m in sys.modules}} & set({sorted(packages)!r})))"],
                          capture_output=True, text=True, timeout=IMPORT_TIMEOUT, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return ast.literal_eval(proc.stdout.splitlines()[-1])  # the printed list of names


@pytest.mark.parametrize("modules", [
    "fedlm.engine, fedlm.engine.loop, fedlm.engine.events, fedlm.servers.streamed, "
    "fedlm.servers.regions, "
    "fedlm.engine.in_flight, fedlm.engine.state",
    "fedlm.job, fedlm.shards, fedlm.params, fedlm.sim.faults, fedlm.sim.fleet, fedlm.sim.network",
])
def test_the_engine_imports_without_torch_or_flower(modules):
    # The scheduling core speaks fedlm.job's vocabulary; tensors reach it only as
    # opaque payloads (torch loads with the first update it decodes).
    assert _loaded_after(f"import {modules}", {"torch", "flwr", "ray"}) == []


def test_an_in_process_run_and_its_replay_load_neither_flower_nor_datasets(tmp_path):
    # Importing Flower (~2 s) and `datasets` (~1.5 s) was a third of a tiny run's or a
    # replay's start: neither uses Flower, and a cached corpus needs no `datasets`.
    from fedlm import data
    from fedlm.config import DataConfig

    data.load_corpus(DataConfig(seq_len=64))  # cached, as after any earlier run
    db = tmp_path / "r.db"
    run = ["run", "--backend", "inprocess", "--quiet", "--db", str(db)]
    for kv in ("model=tiny", "workers=2", "updates=2", "inner.steps=2", "data.seq_len=64",
               "eval.batches=1"):
        run += ["--set", kv]
    code = (f"from fedlm.cli import main; assert main({run!r}) == 0; "
            f"assert main(['replay', '1', '--db', {str(db)!r}]) == 0")
    assert _loaded_after(code, {"flwr", "datasets", "ray"}) == []


MAX_LINES = 400  # a file a newcomer reads in one sitting
MAX_ROOT_MODULES = 20  # the rest lives in rooms by role (docs/architecture.md)


def test_no_python_file_is_over_400_lines():
    files = [p for folder in (*PACKAGES, "tests", "experiments")
             for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) > 50
    long = {str(p.relative_to(ROOT)): n for p in files
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_no_product_file_is_within_30_lines_of_the_cap():
    # headroom: the next change to a product file should not have to split it first
    files = [p for folder in (*PACKAGES, "experiments")
             for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]
    near = {str(p.relative_to(ROOT)): n for p in files
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES - 30}
    assert near == {}


def test_the_fedlm_root_holds_few_modules():
    root = sorted(p.name for p in (ROOT / "fedlm").glob("*.py"))
    assert "job.py" in root and len(root) <= MAX_ROOT_MODULES, root


def test_pyproject_installs_every_package_under_fedlm():
    # strategies/ and dashboard/ install as fedlm.strategies / fedlm.dashboard (no generic
    # top-level names in site-packages); a new subpackage of fedlm/ must be listed too.
    import tomllib
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    wanted = {_module_name(p.parent) if p.parent.name != "fedlm" else "fedlm"
              for package in PACKAGES for p in (ROOT / package).rglob("__init__.py")
              if "__pycache__" not in p.parts}
    assert listed == wanted
    assert tool["package-dir"] == {"fedlm.strategies": "strategies",
                                   "fedlm.dashboard": "dashboard"}


def test_the_top_level_folders_import_under_fedlm_from_a_source_tree():
    code = ("import fedlm.strategies.base as b, fedlm.dashboard as d, sys; "
            "print(b.__file__); print(d.__file__); print('strategies' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=IMPORT_TIMEOUT, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    base, dash, old = proc.stdout.split()
    assert Path(base) == ROOT / "strategies" / "base.py"
    assert Path(dash) == ROOT / "dashboard" / "__init__.py"
    assert old == "False"  # one copy of each module, under one name
