"""One statement a line in the product's code (``fedlm``, ``strategies``, ``dashboard``).

A file's size is capped (``tests/test_imports.py``), and a cap invites the squeeze: two
statements joined with ``;``, or ``if x: return y`` on one line, to come in under it. A
file that grew a second concept is split instead (issue 60). This keeps the squeeze out:

- no ``;`` between statements;
- no compound statement (``if``, ``elif``, ``else``, ``for``, ``while``, ``with``, ``try``,
  ``except``, ``finally``, ``def``, ``class``) with its body on its header's line; the
  one exception is a stub whose whole body is ``...`` (a protocol's method).

And the names a split moved out of a module are still read where they were read before
(``fedlm.sim.dynamics.features``, ``fedlm.sweep.report.time_to_reach``, ...): the same
objects, re-exported.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fedlm", "strategies", "dashboard")


def _sources() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))
            if "__pycache__" not in p.parts]


def _semicolons(text: str) -> list[int]:
    return [tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.OP and tok.string == ";"]


def _stub(body: list[ast.stmt]) -> bool:
    """A body that is ``...`` alone (a protocol's method, say)."""
    return (len(body) == 1 and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant) and body[0].value.value is Ellipsis)


def _one_line_compounds(text: str) -> list[int]:
    """Lines where a block's first statement follows its header (``if x: y``,
    ``else: y``, ``except E: pass``, ``def f(): return 1``), stubs aside."""
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not (isinstance(block, list) and block and isinstance(block[0], ast.stmt)):
                continue
            first = block[0]
            before = lines[first.lineno - 1].encode()[:first.col_offset]  # offsets: bytes
            if before.strip() and not _stub(block):
                found.append(first.lineno)
    return found


def test_no_two_statements_share_a_line():
    squeezed = {}
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        lines = sorted(set(_semicolons(text)) | set(_one_line_compounds(text)))
        if lines:
            squeezed[str(path.relative_to(ROOT))] = lines
    assert squeezed == {}, f"statements sharing a line (file: line numbers): {squeezed}"


def test_the_checks_see_a_squeeze():
    """Each form of the squeeze is found (the test above is not vacuous)."""
    assert _semicolons("a = 1; b = 2\n") == [1]
    assert _one_line_compounds("if x: y = 1\n") == [1]
    assert _one_line_compounds("if x:\n    y = 1\nelse: y = 2\n") == [3]
    assert _one_line_compounds("for i in r: pass\n") == [1]
    assert _one_line_compounds("try:\n    f()\nexcept E: pass\n") == [3]
    assert _one_line_compounds("try:\n    f()\nfinally: g()\n") == [3]
    assert _one_line_compounds("def f(): return 1\n") == [1]
    assert _one_line_compounds("while x: x -= 1\n") == [1]
    assert _one_line_compounds("with a: b()\n") == [1]
    assert _one_line_compounds("if x:\n    y = 1\nelif z: y = 2\n") == [3]
    assert _one_line_compounds("if (x and\n        z): y = 1\n") == [2]
    assert _one_line_compounds("def f(x):\n    if x: return 'é'\n    return x\n") == [2]
    # and what is not one
    assert _one_line_compounds("def f(self) -> int: ...\n") == []
    assert _one_line_compounds("if x:\n    y = 1\nelif z:\n    y = 2\nelse:\n    y = 3\n") == []
    assert _one_line_compounds("try:\n    f()\nexcept E:\n    pass\nelse:\n    g()\n") == []
    assert _semicolons("s = 'a; b'  # c; d\n") == []


def test_names_moved_out_of_a_module_are_still_read_where_they_were():
    from fedlm import data
    from fedlm.data import documents
    from fedlm.sim import dynamics, dynamics_settings
    from fedlm.sweep import curves, report

    assert dynamics.features is dynamics_settings.features  # fedlm.runner, fedlm.cli
    assert report.time_to_reach is curves.time_to_reach  # experiments/compare.py
    assert report.value_at is curves.value_at
    for name in ("parse_play", "shakespeare_documents", "shakespeare_play_count",
                 "document_rows", "rows_digest"):  # the config check, tests
        assert getattr(data, name) is getattr(documents, name), name
