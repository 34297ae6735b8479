"""Sweeps: strategies × heterogeneity profiles, one `fedlm run` each, one report.

    fedlm sweep experiments/configs/paper.toml [--quick] [--backend flower|inprocess] [--jobs N]
                                               [--seeds N]

The spec (TOML) names a run database, a markdown report, shared ``base``
overrides, the ``profiles`` to cross, and ``[[arm]]`` entries (``label``,
``set``; one arm is the ``reference``, the synchronous baseline). ``seeds``
(top level, or an arm's own) runs every cell once per seed, each with
``seed=S`` set last so that it wins over ``base`` and the arm's ``set``;
``--seeds N`` replaces them all with 0..N-1. Without either, a cell is one run
with the seed its config gives, named as before seeds existed (``ARM @ PROFILE``),
so that stores of earlier sweeps are still reused; with them, ``ARM @ PROFILE
seed S``. ``[quick]``
holds overrides for ``--quick`` (``base`` added to the shared ones,
``profiles`` replacing them). ``[paper]`` maps arm labels to the paper's final
perplexities per profile, shown beside ours. Finished runs are reused by name,
so an interrupted sweep resumes where it stopped (``--rerun`` to start over).
``load_spec`` reads the spec once and checks it whole (its shape, then every
run's config), so that a bad spec is refused in one line before the first run.
With the in-process backend ``--jobs N`` trains N runs at once into the one
run store; the results are the same as one at a time (virtual clock, one seed
per run), only sooner. A cell that fails is reported with its reason and the
others go on (``--fail-fast`` stops the sweep at the first); the report shows
it as failed, or as diverged (``eval.diverge_factor``; ``fedlm run`` exits 3), with
the run's one-line reason. Stopping the sweep (Ctrl-C, SIGTERM) stops the runs it
started: each is kept, marked interrupted.

The report (``fedlm.sweep.report``): final validation perplexity per arm ×
profile laid out like the paper's table, beside the paper's, per-update and
per-wall-clock comparisons, idle fractions, and PNG plots; over several seeds,
means with 95% intervals and differences paired by seed (``fedlm.sweep.uncertainty``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fedlm import config_load, store
from fedlm.errors import ConfigError


@dataclass(frozen=True)
class Cell:
    arm: str
    profile: str
    run_id: int
    summary: store.RunSummary
    seed: int | None = None  # None: the spec gives no seeds (one run, the config's seed)


# `fedlm run`'s exit status for a run that diverged (fedlm.cli.runs.EXIT_STATUS).
DIVERGED_EXIT = 3


@dataclass(frozen=True)
class Failure:
    arm: str
    profile: str
    reason: str  # one line: the run's own error
    seed: int | None = None
    status: str = "failed"  # failed | diverged (its validation loss blew up)

    @property
    def name(self) -> str:
        return run_name(self.arm, self.profile, self.seed)


@dataclass(frozen=True)
class Planned:
    """One run of the sweep: an arm on a profile with a seed."""

    name: str
    profile: str
    arm: dict
    seed: int | None  # None: no ``seed=`` override (the spec gives no seeds)


@dataclass
class SweepResult:
    cells: list[Cell]  # the finished ones
    failures: list[Failure] = field(default_factory=list)
    stopped: bool = False  # --fail-fast or a signal ended it before every cell ran
    not_run: list[str] = field(default_factory=list)  # --report-only: cells not finished


class SweepStopped(Exception):
    """SIGTERM reached the sweep."""


def run_name(arm: str, profile: str, seed: int | None = None) -> str:
    """The name a cell's run is stored (and reused) under; without seeds, the name
    sweeps gave before seeds existed."""
    return f"{arm} @ {profile}" + ("" if seed is None else f" seed {seed}")


def seeds_of(spec: dict, arm: dict) -> list[int | None]:
    """The seeds ``arm`` runs with: its own ``seeds``, else the spec's, else one run
    with no seed override (``[None]``)."""
    return list(arm.get("seeds", spec.get("seeds", [None])))


def cells_of(spec: dict) -> list[Planned]:
    """Every run of the sweep: each arm on the spec's profiles (or the subset its own
    ``profiles`` names), once per seed. Seed by seed, so that an interrupted sweep
    has whole seeds done rather than every seed of a few arms; with one seed, in the
    order of profiles then arms, as always."""
    seeds = list(dict.fromkeys(s for arm in spec["arm"] for s in seeds_of(spec, arm)))
    return [Planned(run_name(arm["label"], profile, seed), profile, arm, seed)
            for seed in seeds for profile in spec["profiles"] for arm in spec["arm"]
            if profile in arm.get("profiles", spec["profiles"]) and seed in seeds_of(spec, arm)]


def overrides(spec: dict, cell: Planned) -> list[str]:
    """The ``--set`` overrides of ``cell``'s run, in the order they apply: the
    spec's base, the profile, the arm's own, then the seed (last: it wins)."""
    seed = [] if cell.seed is None else [f"seed={cell.seed}"]
    return [*spec.get("base", []), f"profile={cell.profile}", *cell.arm["set"], *seed]


def reference_of(spec: dict, arm: dict) -> str:
    """The label of the arm ``arm`` is compared with: its ``against``, else the
    spec's reference (``reference = true``)."""
    if arm.get("against"):
        return arm["against"]
    if any(a.get("against") == arm["label"] for a in spec["arm"]):
        return arm["label"]  # the reference of a group of its own
    return next(a["label"] for a in spec["arm"] if a.get("reference"))


def load_spec(path: str | Path, quick: bool, seeds: int | None = None) -> dict:
    """The sweep spec at ``path``, its ``[quick]`` version if ``quick``, checked: its
    shape, then every run's config, so that a bad spec fails in one line
    (``ConfigError``, naming the spec and the field) before the first run starts.
    ``seeds`` (``--seeds N``) replaces the spec's seeds, and every arm's, by 0..N-1."""
    where = f"sweep spec {path}"
    spec = _read_toml(path, where)
    _check_shape(spec, where)
    for key in ("db", "out", "arm", "profiles"):
        if key not in spec:
            raise ConfigError(f"{where}: missing {key!r}")
    if sum(bool(a.get("reference")) for a in spec["arm"]) != 1:
        raise ConfigError(f"{where}: exactly one [[arm]] needs reference = true")
    labels = [a["label"] for a in spec["arm"]]
    for arm in spec["arm"]:
        if arm.get("against", arm["label"]) not in labels:
            raise ConfigError(f"{where}: arm {arm['label']!r}: against names no arm "
                              f"({arm['against']!r})")
    if quick:
        q = spec.get("quick", {})
        if "arms" in q:  # --quick runs only these arms
            unknown = sorted(set(q["arms"]) - set(labels))
            if unknown:
                raise ConfigError(f"{where}: quick.arms: no arm {unknown[0]!r}")
            spec["arm"] = [a for a in spec["arm"] if a["label"] in q["arms"]]
        spec["base"] = [*spec.get("base", []), *q.get("base", [])]
        spec["profiles"] = q.get("profiles", spec["profiles"])
        spec["db"] = q.get("db", spec["db"])
        spec["out"] = q.get("out", spec["out"])
    if not spec["profiles"]:
        raise ConfigError(f"{where}: profiles: must name at least one profile")
    if seeds is not None:
        check_seeds_count(seeds)
        spec["seeds"] = list(range(seeds))
        for arm in spec["arm"]:
            arm.pop("seeds", None)
    checked = set()
    for cell in cells_of(spec):  # every run's config, as `fedlm run` loads it
        if (cell.profile, cell.arm["label"]) in checked:
            continue  # the seed alone cannot make it invalid: _check_shape checked each
        checked.add((cell.profile, cell.arm["label"]))
        try:
            config_load.load(None, overrides(spec, cell))
        except ConfigError as exc:
            raise ConfigError(f"{where}: arm {cell.arm['label']!r} @ {cell.profile}: "
                              f"{exc}") from None
    return spec


def check_seeds_count(n: int) -> None:
    """Refuse a ``--seeds`` count below 1 (``ConfigError``)."""
    if n < 1:
        raise ConfigError(f"--seeds: must be at least 1, got {n}")


def _read_toml(path: str | Path, where: str) -> dict:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"sweep spec: {str(path)!r} is a directory, not a TOML file")
    if not p.is_file():
        raise ConfigError(f"sweep spec: no such file {str(path)!r}")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:  # TOML, UTF-8, nesting, huge ints
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise ConfigError(f"{where}: not a TOML file ({text or 'too deep'})") from None


def _check_shape(raw: dict, where: str) -> None:
    """The types of what ``load_spec`` reads (tables, strings, lists of strings), so
    that a wrong one is named rather than failing as a KeyError or TypeError later."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: {what}")

    def strings(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    quick_part = raw.get("quick", {})
    need(isinstance(quick_part, dict), "quick: must be a [quick] table")
    for part, prefix in ((raw, ""), (quick_part, "quick.")):
        for key in ("db", "out"):
            need(isinstance(part.get(key, ""), str), f"{prefix}{key}: must be a string")
            if key in part:
                need(part[key].strip() != "", f"{prefix}{key}: must be a path, got {part[key]!r}")
        need(strings(part.get("base", [])), f"{prefix}base: must be a list of key=value strings")
        need(strings(part.get("profiles", [])), f"{prefix}profiles: must be a list of names")
    arms = raw.get("arm", [])
    need(isinstance(arms, list) and all(isinstance(a, dict) for a in arms),
         "arm: must be [[arm]] tables")
    for k, arm in enumerate(arms):
        need(isinstance(arm.get("label"), str) and arm["label"] != "",
             f"arm[{k}].label: must be a non-empty string")
        need(strings(arm.get("set")), f"arm[{k}].set: must be a list of key=value strings")
        need(isinstance(arm.get("reference", False), bool), f"arm[{k}].reference: must be "
             f"true or false")
        need(strings(arm.get("profiles", [])), f"arm[{k}].profiles: must be a list of names")
        need(isinstance(arm.get("against", ""), str), f"arm[{k}].against: must be an arm's label")
        if "seeds" in arm:
            _check_seeds(arm["seeds"], f"arm[{k}].seeds", need)
            # else its runs could pair with no reference run: those have no seed
            need("seeds" in raw, f"arm[{k}].seeds: needs the spec's own seeds too (top "
                 f"level, e.g. seeds = [0, 1, 2])")
    if "seeds" in raw:
        _check_seeds(raw["seeds"], "seeds", need)
    need(strings(quick_part.get("arms", [])), "quick.arms: must be a list of arm labels")
    labels = [a["label"] for a in arms]
    need(len(set(labels)) == len(labels), "arm: labels must be unique")


def _check_seeds(value: object, key: str, need) -> None:
    """A ``seeds`` list: distinct ints, at least one (a bool is not a seed, though
    Python counts it as an int). Each in [0, 2**63): numpy's generators refuse a
    negative seed, and the run store holds 64 signed bits."""
    need(isinstance(value, list) and value != [], f"{key}: must be a non-empty list of "
         f"integers, got {value!r}")
    need(all(isinstance(s, int) and not isinstance(s, bool) for s in value),
         f"{key}: must be a list of integers, got {value!r}")
    need(all(0 <= s < 2**63 for s in value), f"{key}: each seed must be in [0, 2**63), "
         f"got {value!r}")
    need(len(set(value)) == len(value), f"{key}: seeds must be distinct, got {value!r}")


def check_jobs(jobs: int, backend: str) -> None:
    """Refuse a ``jobs`` count that ``run_sweep`` cannot honour (``ConfigError``)."""
    if jobs < 1:
        raise ConfigError("--jobs: at least 1")
    if jobs > 1 and backend != "inprocess":
        raise ConfigError("--jobs: more than 1 needs --backend inprocess (each Flower "
                         "simulation starts a Ray instance of its own)")


class _Children:
    """The ``fedlm run`` processes a sweep has started; ``stop`` ends them (SIGTERM:
    each marks its run interrupted; SIGKILL after ``grace`` seconds) and starts
    no more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.stopping = threading.Event()

    def run(self, cmd: list[str]) -> tuple[int, str, str] | None:
        """(exit status, stdout, stderr), or None if the sweep is stopping."""
        with self._lock:
            if self.stopping.is_set():
                return None
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            self._procs.add(proc)
        try:
            out, err = proc.communicate()
        finally:
            with self._lock:
                self._procs.discard(proc)
        return proc.returncode, out, err

    def stop(self, grace: float = 30.0) -> None:
        with self._lock:
            self.stopping.set()
            procs = list(self._procs)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _reason(stderr: str, status: int) -> str:
    """The line of a failed ``fedlm run`` that says why (its one-line error)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("fedlm: ")]
    why = (said or lines or [f"exit status {status}"])[-1]
    return why.removeprefix("fedlm: error: ").removeprefix("fedlm: ")


def run_sweep(spec: dict, *, backend: str = "flower", rerun: bool = False, jobs: int = 1,
              fail_fast: bool = False, report_only: bool = False, log=print) -> SweepResult:
    """Run every arm x profile x seed not already finished in the spec's database.

    ``jobs`` runs that many ``fedlm run`` processes at once (in-process backend
    only: each Flower simulation starts a Ray instance of its own). A run's
    result does not depend on what runs beside it: the clock is virtual and each
    run has its own seed, so ``jobs`` only changes the wall-clock time. A failed
    cell is logged with its reason and the sweep goes on, unless ``fail_fast``.
    SIGTERM (in the main thread) or Ctrl-C stops every run it started.
    ``report_only`` runs nothing: the result holds the cells already finished and
    names the others in ``not_run`` (a report of a sweep still under way, or cut short).
    """
    check_jobs(jobs, backend)
    db = spec["db"]
    planned = cells_of(spec)
    total = len(planned)
    finished = {r["name"]: r["id"] for r in (store.list_runs(db) if Path(db).exists() else [])
                if r["status"] == "finished"}  # the newest finished run of each name
    todo, not_run = [], []
    for k, cell in enumerate(planned, 1):
        if cell.name in finished and not rerun:
            log(f"[{k}/{total}] {cell.name}: reusing run {finished[cell.name]}")
        elif report_only:
            not_run.append(cell.name)
            log(f"[{k}/{total}] {cell.name}: not run (--report-only)")
        else:
            todo.append((k, cell))
    children = _Children()
    failures: list[Failure] = []
    trained: set[str] = set()

    def train(item) -> None:
        k, cell = item
        name = cell.name
        cmd = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", backend,
               "--db", db]
        for kv in [*overrides(spec, cell), f"name={name}"]:
            cmd += ["--set", kv]
        if children.stopping.is_set():
            return
        log(f"[{k}/{total}] {name} ...")
        t0 = time.time()
        result = children.run(cmd)
        if result is None or children.stopping.is_set() and result[0] != 0:
            return  # stopped with the sweep: not a failure of the cell
        status, _, err = result
        if status != 0:
            failures.append(Failure(cell.arm["label"], cell.profile, _reason(err, status),
                                    cell.seed,
                                    "diverged" if status == DIVERGED_EXIT else "failed"))
            log(f"    [{k}/{total}] {name} {failures[-1].status.upper()}: "
                f"{failures[-1].reason}")
            if fail_fast:
                children.stop()
            return
        trained.add(name)
        log(f"    [{k}/{total}] {name} done in {time.time() - t0:.0f} s")

    def on_sigterm(signum, frame) -> None:
        raise SweepStopped

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(train, item) for item in todo]
            try:
                for future in futures:
                    future.result()
            except BaseException:  # Ctrl-C or SIGTERM: stop what runs, start nothing more
                children.stop()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    newest = {r["name"]: r["id"] for r in store.list_runs(db)} if trained else {}
    cells = []
    for cell in planned:
        name = cell.name
        run_id = newest.get(name) if name in trained else finished.get(name)
        if run_id is not None and (name in trained or not rerun):
            cells.append(Cell(cell.arm["label"], cell.profile, run_id,
                              store.summarize(db, run_id), cell.seed))
    return SweepResult(cells, failures, stopped=children.stopping.is_set(), not_run=not_run)
