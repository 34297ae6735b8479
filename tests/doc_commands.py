"""How tests/test_doc_commands.py finds the ``fedlm`` commands of README.md and docs/*.md
and checks each as the command would, without training (that file says what holds)."""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import re
import shlex
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fedlm.cli import COMMANDS
from fedlm.cli.parser import build_parser
from fedlm.errors import ConfigError


ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = ("experiments", "examples")  # what the docs' commands read, seen from the scratch folder

FENCE = re.compile(r"^\s*(```|~~~)\s*(\w*)")
NOT_SHELL = {"python", "json", "toml", "yaml", "text"}  # fenced blocks that hold no commands
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
SAYS = re.compile(r"^\)?\s*says\s+`([^`]+)`")  # (`fedlm run --set x=1` says `x: ...`)

# A placeholder stands for a value the reader supplies: the stand-in it is parsed with.
PLACEHOLDERS = {"N": "2", "ID": "1", "RUN_ID": "1", "RUN": "1", "PATH": "some.db",
                "FILE": "some.toml", "DIR": "somewhere", "NAME": "tensorboard",
                "SPEC": "spec.toml", "SPEC.toml": "spec.toml", "CONFIG": "config.toml",
                "CONFIG.toml": "config.toml", "HEAD": "127.0.0.1", "TEXT": "text"}
PLACEHOLDER = re.compile(r"(?<![\w.])(%s)(?![\w])" % "|".join(
    re.escape(k) for k in sorted(PLACEHOLDERS, key=len, reverse=True)))


@dataclass(frozen=True)
class DocCommand:
    where: str  # FILE:LINE
    text: str  # as the docs write it (continued lines joined)
    argv: tuple[str, ...]  # the words after ``fedlm``
    env: tuple[tuple[str, str], ...]  # NAME=value prefixes (PYTHONPATH=examples)
    inline: bool  # from inline backticks, not a code block
    placeholder: bool  # holds a placeholder: parsed with stand-ins, its config not checked
    refused_with: str | None = None  # the docs show it refused with this message


def _words(text: str, variables: dict[str, list[str]]) -> list[list[str]] | None:
    """The simple commands of one shell line, as words (``$VAR`` expanded, comments
    dropped, split at ``&&``, ``;`` and ``|``); None if it is not shell."""
    for name, words in variables.items():  # unquoted $Q: split into its words
        text = re.sub(r"\$\{?%s\}?(?!\w)" % name, " ".join(shlex.quote(w) for w in words), text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: prose, not a command
        return None
    out = [[]]
    for token in tokens:  # a run of ; & | ends a simple command
        out.append([]) if token and set(token) <= set(";&|") else out[-1].append(token)
    return [c for c in out if c]


def _command(words: list[str], where: str, text: str, inline: bool,
             refused_with: str | None = None) -> DocCommand | None:
    """A fedlm command from one simple command's words, or None if it is not one."""
    env = []
    while words and ASSIGNMENT.match(words[0]) and words[0] != "fedlm":
        env.append(ASSIGNMENT.match(words[0]).groups())
        words = words[1:]
    if len(words) < 2 or words[0] != "fedlm" or words[1] not in COMMANDS \
            or any(w.endswith(":") for w in words[1:3]):  # "fedlm trace device: error:"
        return None
    argv, placeholder, optional = [], False, False  # optional: inside [--db PATH]
    for word in words[1:]:
        if word in ("...", "…"):  # "and the rest": not a word of the command
            placeholder = True
            continue
        if word.startswith("[-"):
            word, optional = word[1:], True
        if optional and word.endswith("]"):
            word, optional = word[:-1], False
        stood_in = PLACEHOLDER.sub(lambda m: PLACEHOLDERS[m.group(1)], word)
        placeholder |= stood_in != word
        argv.append(stood_in)
    return DocCommand(where, text, tuple(argv), tuple(env), inline, placeholder, refused_with)


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{line}"


def commands_in(path: Path) -> list[DocCommand]:
    """Every fedlm command of one markdown file, in the order it gives them."""
    out: list[DocCommand] = []
    in_code, shell, variables = False, True, {}
    pending, start = "", 0
    prose: list[tuple[int, str]] = []  # the paragraph so far: inline spans may wrap

    def inline_spans() -> None:
        if not prose:
            return
        first, text = prose[0][0], "\n".join(line for _, line in prose)
        for m in re.finditer(r"`([^`]+)`", text):
            span = " ".join(m.group(1).split())
            says = SAYS.match(" ".join(text[m.end():].split()))
            refused = " ".join(says.group(1).split()) if says else None
            line = first + text.count("\n", 0, m.start())
            for words in _words(span, {}) or []:
                if cmd := _command(words, _where(path, line), span, True, refused):
                    out.append(cmd)
        prose.clear()

    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            inline_spans()
            in_code, pending = not in_code, ""
            shell = fence.group(2).lower() not in NOT_SHELL
            variables = {}
            continue
        if not in_code:
            prose.append((n, line)) if line.strip() else inline_spans()
            continue
        if not shell:
            continue
        if not pending:
            start = n
        pending = f"{pending} {line.strip()}" if pending else line.strip()
        if pending.endswith("\\"):  # continued on the next line
            pending = pending[:-1].rstrip()
            continue
        text, pending = pending.removeprefix("$ "), ""
        for words in _words(text, variables) or []:
            if len(words) == 1 and ASSIGNMENT.match(words[0]):  # Q="--set ..."
                name, value = ASSIGNMENT.match(words[0]).groups()
                variables[name] = shlex.split(value)
            elif cmd := _command(words, _where(path, start), text, False):
                out.append(cmd)
    inline_spans()
    return out


# -- checking one command ---------------------------------------------------

class Refused(Exception):
    """The command would end in a refusal (its one line)."""


def _parse(argv: tuple[str, ...]) -> argparse.Namespace:
    err = io.StringIO()  # argparse's one line
    with contextlib.redirect_stderr(err):
        try:
            return build_parser().parse_args(list(argv))
        except SystemExit:
            raise Refused(err.getvalue().strip().splitlines()[-1]) from None


def _subparser(argv: tuple[str, ...]) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``argv`` names: ``deploy local``, ``trace show``."""
    parser = build_parser()
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    return parser


def _mention_flags(cmd: DocCommand) -> None:
    """An inline mention that is not a whole command: every flag it names is one of the
    command's, and every flag given a value parses with it."""
    parser = _subparser(cmd.argv)
    known = {s for a in parser._actions for s in a.option_strings}
    for word in cmd.argv:
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            raise Refused(f"{flag}: not a flag of `{parser.prog}`")


@lru_cache(maxsize=None)
def _sweep_spec(path: str, quick: bool, seeds: int | None):
    """A spec checked once per test session: several docs name the same one (a spec of
    21 arms takes seconds, every arm x profile's config loaded)."""
    from fedlm.sweep import spec as sweep_spec

    return sweep_spec.load_spec(path, quick, seeds=seeds)


def _check_config(args: argparse.Namespace) -> None:
    """What the command checks of its config before it trains, plans or deploys."""
    from fedlm import config_load

    command = args.command
    if command == "run" and args.resume is None:
        from fedlm.cli.run import _check_backend
        from fedlm.track import with_trackers

        cfg = config_load.load(args.config, args.overrides)
        _check_backend(cfg, args.backend)
        with_trackers(cfg, args.track)
    elif command == "deploy":
        from fedlm.deploy import run_local

        overrides = [*args.overrides, *([f"workers={args.workers}"] if args.workers else [])]
        run_local.check_config(config_load.load(args.config, overrides))
    elif command == "config":
        config_load.load(args.config, args.overrides)
    elif command == "plan":
        _check_plan(args)
    elif command == "sweep":
        from fedlm.sweep import run as sweep_run, spec as sweep_spec

        sweep_run.check_jobs(args.jobs, args.backend)
        spec = _sweep_spec(str(Path(args.spec).resolve()), args.quick, args.seeds)
        if args.arms:
            sweep_spec.only_arms(copy.deepcopy(spec), args.arms)
        if args.report_only and args.rerun:
            raise Refused("--report-only with --rerun")
    elif command == "trace":  # generated where the docs' next commands look for it
        from fedlm.cli.trace import cmd_trace

        with contextlib.redirect_stdout(io.StringIO()):
            cmd_trace(args)


def _check_plan(args: argparse.Namespace) -> None:
    from fedlm.cli import plan

    if args.config is not None or args.set:
        from fedlm.cli.plan_config import plan_config, refuse_fleet_flags

        refuse_fleet_flags(args, plan._plan_actions())
        with contextlib.redirect_stdout(io.StringIO()):
            plan_config(args, None if args.params is None else plan.parse_count(args.params))
        return
    args.params = args.params or plan.PARAMS
    if args.walltime:
        plan.wall_input(args)
        return
    plan.input_from_args(args)  # what the plan, the scan and the plots are made of
    if args.step_time is None:
        plan.derived_step(args)


def check(cmd: DocCommand, cwd: Path) -> None:
    """Refused (its one line) if ``cmd`` would be refused before it trains."""
    try:
        args = _parse(cmd.argv)
    except Refused as exc:  # inline, a mention (`fedlm sweep`, `fedlm run --resume`)?
        if not (cmd.inline and not cmd.refused_with and re.search(
                "required|expected one argument", str(exc))):
            raise
        _mention_flags(cmd)
        return
    if cmd.placeholder:
        return
    paths = [str(cwd / p) for name, value in cmd.env if name == "PYTHONPATH"
             for p in value.split(os.pathsep)]
    modules = set(sys.modules)
    sys.path[:0] = paths
    try:
        _check_config(args)
    except (ConfigError, ValueError, OSError, KeyError) as exc:
        raise Refused(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    finally:
        del sys.path[:len(paths)]
        for name in set(sys.modules) - modules:  # plug-ins: importable only where the docs say
            if any(str(getattr(sys.modules[name], "__file__", "") or "").startswith(p)
                   for p in paths):
                del sys.modules[name]


def failures(path: Path, cwd: Path) -> list[str]:
    """Each command of ``path`` that does not hold as written: FILE:LINE, it, why."""
    out = []
    for cmd in commands_in(path):
        expected = cmd.refused_with
        try:
            check(cmd, cwd)
        except Refused as exc:
            if expected is None:
                out.append(f"{cmd.where}: `{cmd.text}`: {exc}")
            elif expected not in " ".join(str(exc).split()):
                out.append(f"{cmd.where}: `{cmd.text}`: the docs say it is refused with "
                           f"{expected!r}; it is refused with {str(exc)!r}")
            continue
        if expected is not None:
            out.append(f"{cmd.where}: `{cmd.text}`: the docs say it is refused with "
                       f"{expected!r}; it is accepted")
    return out
