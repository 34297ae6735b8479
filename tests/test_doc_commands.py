"""Every ``fedlm ...`` command in README.md and docs/*.md holds as written: its flags
parse with the real parser (``fedlm.cli.parser``), and a command that takes a config
(``run``, ``deploy``, ``plan``, ``config``, ``sweep``) has it loaded and checked as the
command checks it before anything runs, without training; a sweep's spec is expanded
(``fedlm.sweep.spec.load_spec``, ``--arms`` too) and every planned run's config checked.
``fedlm trace`` commands that write a trace run, in a scratch folder, so that the
commands after them find it, as a reader's would.

Commands are taken from fenced code blocks (continued lines joined, ``# comments``
dropped, ``PYTHONPATH=examples`` and other ``NAME=value`` prefixes applied, shell
variables set in the block expanded) and from inline backticks. Placeholders
(``N``, ``RUN_ID``, ``PATH``, ``[--db PATH]``, ``...``) stand for a value: such a
command's flags are parsed with a stand-in, its config is not checked. An inline
mention of a command or of one of its flags (``fedlm sweep``, ``fedlm run --resume``)
need not be complete, but every flag it names must be one of the command's. A
command the docs show being refused (`` `CMD` says `MESSAGE` ``) must be refused with
that message.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

import pytest

from tests.doc_commands import DOCS, LINKED, ROOT, commands_in, failures


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A folder that looks like the checkout to the docs' commands (relative paths of
    experiments/ and examples/ read the real ones) and takes what they write. The
    installed strategy plug-ins are read once (every config load reads every installed
    package's entry points, ~60 ms: a spec of 60 configs spent 9 s on them), as they
    cannot change while the test runs."""
    from fedlm.strategies import registry

    monkeypatch.setattr(registry, "plugin_strategies", lru_cache(registry.plugin_strategies))
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_in_the_docs_holds_as_written(doc, scratch):
    bad = failures(doc, scratch)
    assert not bad, "\n".join(bad)


def test_the_docs_have_commands_to_check():
    """The extraction finds what is there: a broken extractor would pass every doc."""
    found = [c for doc in DOCS for c in commands_in(doc)]
    checked = [c for c in found if not c.placeholder and c.argv[0] in
               ("run", "sweep", "plan", "deploy", "config")]
    assert len(found) > 150 and len(checked) > 60
    texts = {c.text for c in found}
    assert any("outer.fraction=0.1" in t and "workers=1000" in t for t in texts)  # joined lines
    plugin = next(c for c in found if "fedopt:FedAdam" in c.text)
    assert plugin.env == (("PYTHONPATH", "examples"),) and plugin.argv[0] == "run"


# -- the checker itself: a broken command is caught -----------------------

BROKEN = """\
Some prose with `fedlm run --set workers=1000 --set strategy=fedavg` inline.

```bash
fedlm run --set model=tiny \\
    --set workers=1000   # every play to a worker: too many
PYTHONPATH=examples fedlm run --set strategy=fedopt:FedAdam --set outer.nope=1
Q="--set model=tiny --set updates=0"
fedlm run $Q --set strategy=diloco
fedlm plan --data-centres 3 --workers 4
fedlm sweep experiments/archive/configs/paper.toml --arms "no such arm"
fedlm runs --no-such-flag
fedlm run --set model=tiny   # fine
fedlm trace device: error: argument --clients: ... (output, not a command)
```

A mention: `fedlm export --track` and `fedlm show --bogus`; `fedlm run --set
'fleet.slowdown={factor=0.5}'` says `fleet.slowdown.factor: must be a factor in (1,
1e+06]`, and `fedlm config --set model=tiny` says `model: no such thing`.
"""


def test_a_broken_command_in_the_docs_fails_the_check(scratch):
    doc = scratch / "broken.md"
    doc.write_text(BROKEN)
    got = failures(doc, scratch)
    lines = {line.split(":")[1]: line for line in got}  # by line of BROKEN
    assert "workers: must be at most" in lines["1"]  # inline, by-play over 38 plays
    assert "workers: must be at most" in lines["4"]  # continued line joined
    assert "outer.nope" in lines["6"]  # a plug-in's setting, PYTHONPATH applied
    assert "updates" in lines["8"]  # $Q expanded
    assert "--workers" in lines["9"]
    assert "--arms" in lines["10"]
    assert "--no-such-flag" in lines["11"]
    assert "--bogus: not a flag of `fedlm show`" in lines["16"]
    assert "model: no such thing" in lines["18"] and "fleet.slowdown" not in " ".join(got)
    assert len(got) == 9, got  # the rest hold: a mention, a fine run, the documented refusal


def test_a_plugin_without_its_pythonpath_is_refused(scratch, monkeypatch):
    """PYTHONPATH=examples is what makes a plug-in load: without it, the command fails."""
    # as a fresh process would be: another test of this process may have put examples/
    # on the path (tests/test_newcomer_plugins.py does) and loaded the plug-in
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p).name != "examples"])
    monkeypatch.delitem(sys.modules, "fedopt", raising=False)
    doc = scratch / "plugin.md"
    doc.write_text("```bash\nPYTHONPATH=examples fedlm run --set strategy=fedopt:FedAdam\n"
                   "fedlm run --set strategy=fedopt:FedAdam\n```\n")
    got = failures(doc, scratch)
    assert len(got) == 1 and got[0].startswith("plugin.md:3: ") and "fedopt" in got[0]
