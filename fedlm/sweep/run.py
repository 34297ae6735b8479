"""Sweeps: strategies × heterogeneity profiles, one `fedlm run` each, one report.

    fedlm sweep experiments/configs/fleets_fair.toml [--quick] [--backend flower|inprocess]
                                                     [--jobs N] [--seeds N]

The spec (TOML) names a run database, a markdown report, shared ``base`` overrides,
the ``profiles`` to cross, and ``[[arm]]`` entries (``label``, ``set``; one arm is
the ``reference``, the synchronous baseline), or ``[[fleet]]`` and ``[[arm]]``
tables that state each fleet and each arm once (a matrix, ``fedlm.sweep.matrix``).
``seeds`` (top level, or an arm's own) runs every cell once per seed, each with
``seed=S`` set last so that it wins over ``base`` and the arm's ``set``;
``--seeds N`` replaces them all with 0..N-1. Without either, a cell is one run with
the seed its config gives, named as before seeds existed (``ARM @ PROFILE``), so
that stores of earlier sweeps are still reused; with them, ``ARM @ PROFILE seed S``. ``[quick]``
holds overrides for ``--quick`` (``base`` added to the shared ones, ``profiles``
replacing them). ``[paper]`` maps arm labels to the paper's final
perplexities per profile, shown beside ours. Finished runs are reused by name,
so an interrupted sweep resumes where it stopped (``--rerun`` to start over), and two
sweeps on one store share the work: each cell is claimed before it runs
(``fedlm.sweep.claims``), and a sweep takes the result of a cell another one trains.
``load_spec`` reads the spec once and checks it whole (its shape, then every
run's config), so that a bad spec is refused in one line before the first run.
With the in-process backend ``--jobs N`` trains N runs at once into the one
run store; the results are the same as one at a time (virtual clock, one seed
per run), only sooner. A cell that fails is reported with its reason and the
others go on (``--fail-fast`` stops the sweep at the first); the report shows
it as failed, or as diverged (``eval.diverge_factor``; ``fedlm run`` exits 3), with
the run's one-line reason. Stopping the sweep (Ctrl-C, SIGTERM) stops the runs it
started: each is kept, marked interrupted. A sweep killed outright (SIGKILL) takes them
with it on Linux (the parent-death signal, SIGKILL): each reads as crashed, and the
sweep run again trains those cells anew, once each.

The report (``fedlm.sweep.report``): final validation perplexity per arm ×
profile laid out like the paper's table, beside the paper's, per-update and
per-wall-clock comparisons, idle fractions, and PNG plots; over several seeds,
means with 95% intervals and differences paired by seed (``fedlm.sweep.uncertainty``).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fedlm import store
from fedlm.errors import ConfigError
from fedlm.sweep import claims, tuning
from fedlm.sweep.children import Children
from fedlm.sweep.spec import cells_of, overrides, run_name, tuning_cells


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
    config: tuple[str, ...] = ()  # its configuration, in a tuned sweep

    @property
    def name(self) -> str:
        return run_name(self.arm, self.profile, self.seed, self.config)


@dataclass
class SweepResult:
    cells: list[Cell]  # the finished ones
    failures: list[Failure] = field(default_factory=list)
    stopped: bool = False  # --fail-fast or a signal ended it before every cell ran
    not_run: list[str] = field(default_factory=list)  # --report-only: cells not finished


class SweepStopped(Exception):
    """SIGTERM reached the sweep."""


def check_jobs(jobs: int, backend: str) -> None:
    """Refuse a ``jobs`` count that ``run_sweep`` cannot honour (``ConfigError``)."""
    if jobs < 1:
        raise ConfigError("--jobs: at least 1")
    if jobs > 1 and backend != "inprocess":
        raise ConfigError("--jobs: more than 1 needs --backend inprocess (each Flower "
                         "simulation starts a Ray instance of its own)")


def check_gpu_room(spec: dict, jobs: int) -> None:
    """Runs packed on one GPU (``--jobs N`` where a run's device is CUDA): refused, in
    one line, when N of the largest would not fit in the GPU's free memory."""
    from fedlm import config_load
    from fedlm.sim import memory

    cfgs = [config_load.load(None, overrides(spec, c)) for c in cells_of(spec)[:64]]
    cfgs = [c for c in cfgs if c.device in ("cuda", "auto")]
    if not cfgs:
        return
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        return  # auto on a host without CUDA: the runs train on the CPU
    free, _ = torch.cuda.mem_get_info()
    memory.check_gpu_jobs(cfgs, jobs, free)


def _reason(stderr: str, status: int) -> str:
    """The line of a failed ``fedlm run`` that says why (its one-line error)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("fedlm: ")]
    why = (said or lines or [f"exit status {status}"])[-1]
    return why.removeprefix("fedlm: error: ").removeprefix("fedlm: ")


def run_sweep(spec: dict, *, backend: str = "flower", rerun: bool = False, jobs: int = 1,
              fail_fast: bool = False, report_only: bool = False, track: list[str] = (),
              log=print) -> SweepResult:
    """Run every arm x profile x seed not already finished in the spec's database.

    ``jobs`` runs that many ``fedlm run`` processes at once (in-process backend
    only: each Flower simulation starts a Ray instance of its own). A run's
    result does not depend on what runs beside it: the clock is virtual and each
    run has its own seed, so ``jobs`` only changes the wall-clock time. A failed
    cell is logged with its reason and the sweep goes on, unless ``fail_fast``.
    SIGTERM (in the main thread) or Ctrl-C stops every run it started.
    ``report_only`` runs nothing: the result holds the cells already finished and
    names the others in ``not_run`` (a report of a sweep still under way, or cut short).
    ``track`` sends each run to these experiment trackers (``fedlm.track``), grouped
    by arm and profile (``track.group``), so that an arm's seeds show together.
    """
    check_jobs(jobs, backend)
    if jobs > 1:
        check_gpu_room(spec, jobs)
    if track:
        from fedlm.track import check_installed

        check_installed(list(track))  # one line now, not one failed cell after another
    sweep = _Sweep(spec, backend, rerun, fail_fast, list(track), log)
    if tuning.settings_of(spec) is not None:  # first the tuning seeds, then the choices
        sweep.stage(tuning_cells(spec), "tuning ")
        todo, _ = sweep.plan(report_only)
        sweep.train_all(todo, jobs)
        spec["chosen"] = chosen(spec, log)
        sweep.stage(cells_of(spec), "")
    todo, not_run = sweep.plan(report_only)
    sweep.train_all(todo, jobs)
    return SweepResult(sweep.cells(), sweep.failures, stopped=sweep.children.stopping.is_set(),
                       not_run=not_run)


def chosen(spec: dict, log=print) -> dict:
    """Each arm's choice per profile (``fedlm.sweep.tuning.choose``) from the tuning runs
    in the store; an arm whose tuning runs have not all ended has none yet."""
    t = tuning.settings_of(spec)
    db = spec["db"]
    ended = {}
    for row in store.list_runs(db) if Path(db).exists() else []:
        if row["status"] == "finished":
            ended[row["name"]] = store.summarize(db, row["id"]).final_perplexity
        elif row["status"] in ("failed", "diverged"):
            ended.setdefault(row["name"], None)
    out = {}
    for profile in spec["profiles"]:
        for arm in spec["arm"]:
            if profile not in arm.get("profiles", spec["profiles"]):
                continue
            configs = tuning.grid(arm, t["budget"])
            finals = {c: [ended[n] for s in t["seeds"]
                          if (n := run_name(arm["label"], profile, s, c)) in ended]
                      for c in configs}
            choice = tuning.choose(configs, finals, len(t["seeds"]))
            if choice is not None:
                out[(arm["label"], profile)] = choice
                log(f"tuned {arm['label']} @ {profile}: [{tuning.label(choice.config)}] "
                    f"(mean final perplexity {choice.score:.3f} on the tuning seeds)")
    return out


class _Sweep:
    """One sweep's cells and what became of them: trained here, failed, or trained by
    another sweep on the same store (``fedlm.sweep.claims``)."""

    def __init__(self, spec: dict, backend: str, rerun: bool, fail_fast: bool,
                 track: list[str], log) -> None:
        self.spec = spec
        self.backend = backend
        self.rerun = rerun
        self.fail_fast = fail_fast
        self.track = track
        self.log = log
        self.db = spec["db"]
        self.stage(cells_of(spec), "")
        self.children = Children()
        self.failures: list[Failure] = []
        self.trained: set[str]  # trained by this sweep, in this stage
        self.elsewhere: dict[str, object]  # cells another sweep trains: name -> cell

    def stage(self, planned: list, what: str) -> None:
        """The cells to plan, train and report next (a tuned sweep has two stages)."""
        self.planned = planned
        self.total = len(planned)
        self.what = what
        self.finished = {r["name"]: r["id"] for r in (store.list_runs(self.db)
                                                      if Path(self.db).exists() else [])
                         if r["status"] == "finished"}  # the newest finished run of a name
        self.trained = set()
        self.elsewhere = {}

    def plan(self, report_only: bool) -> tuple[list, list[str]]:
        """(the cells to train, numbered; the names of those not run)."""
        todo, not_run = [], []
        for k, cell in enumerate(self.planned, 1):
            if cell.name in self.finished and not self.rerun:
                self.log(f"[{self.what}{k}/{self.total}] {cell.name}: reusing run {self.finished[cell.name]}")
            elif report_only:
                not_run.append(cell.name)
                self.log(f"[{self.what}{k}/{self.total}] {cell.name}: not run (--report-only)")
            else:
                todo.append((k, cell))
        return todo, not_run

    def finished_now(self, name: str) -> bool:
        return any(r["name"] == name and r["status"] == "finished"
                   for r in store.list_runs(self.db))

    def train_all(self, todo: list, jobs: int) -> None:
        """Train ``todo``, ``jobs`` at once; then wait for the cells other sweeps hold."""
        def on_sigterm(signum, frame) -> None:
            raise SweepStopped

        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
        try:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(self.train, item) for item in todo]
                try:
                    for future in futures:
                        future.result()
                except BaseException:  # Ctrl-C or SIGTERM: stop what runs, start no more
                    self.children.stop()
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
            self.wait_for_others()
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, previous)
            try:
                claims.folder_of(self.db).rmdir()  # once no sweep holds a claim
            except OSError:
                pass

    def wait_for_others(self) -> None:
        for name in claims.wait_for(self.db, sorted(self.elsewhere), self.finished_now,
                                    self.log):
            cell = self.elsewhere[name]  # its owner stopped before it finished
            self.failures.append(Failure(cell.arm["label"], cell.profile, "another sweep "
                                         "claimed it and stopped before it finished",
                                         cell.seed, config=cell.config))

    def train(self, item) -> None:
        """Claim the cell (``fedlm.sweep.claims``), train it, release it; a cell that
        another live sweep holds, or has finished since this one started, is its."""
        k, cell = item
        if self.children.stopping.is_set():
            return
        if not self.rerun and Path(self.db).exists() and self.finished_now(cell.name):
            self.log(f"[{self.what}{k}/{self.total}] {cell.name}: finished by another sweep meanwhile")
            self.elsewhere[cell.name] = cell
            return
        claim = claims.take(self.db, cell.name)
        if claim is None:
            self.log(f"[{self.what}{k}/{self.total}] {cell.name}: another sweep is training it; its run "
                     f"is taken")
            self.elsewhere[cell.name] = cell
            return
        try:
            self.train_claimed(k, cell)
        finally:
            claim.release()

    def command(self, cell) -> list[str]:
        """The ``fedlm run`` of ``cell``."""
        cmd = [sys.executable, "-m", "fedlm", "run", "--quiet", "--backend", self.backend,
               "--db", self.db]
        for kv in [*overrides(self.spec, cell), f"name={cell.name}"]:
            cmd += ["--set", kv]
        if self.track:
            group = json.dumps(f"{cell.arm['label']} @ {cell.profile}")  # a TOML string
            cmd += ["--set", f"track.group={group}"]
            for tracker in self.track:
                cmd += ["--track", tracker]
        return cmd

    def train_claimed(self, k: int, cell) -> None:
        name = cell.name
        cmd = self.command(cell)
        if self.children.stopping.is_set():
            return
        self.log(f"[{self.what}{k}/{self.total}] {name} ...")
        t0 = time.time()
        result = self.children.run(cmd)
        if result is None or self.children.stopping.is_set() and result[0] != 0:
            return  # stopped with the sweep: not a failure of the cell
        status, _, err = result
        if status != 0:
            self.failures.append(Failure(cell.arm["label"], cell.profile, _reason(err, status),
                                         cell.seed,
                                         "diverged" if status == DIVERGED_EXIT else "failed",
                                         cell.config))
            self.log(f"    [{self.what}{k}/{self.total}] {name} {self.failures[-1].status.upper()}: "
                     f"{self.failures[-1].reason}")
            if self.fail_fast:
                self.children.stop()
            return
        self.trained.add(name)
        self.log(f"    [{self.what}{k}/{self.total}] {name} done in {time.time() - t0:.0f} s")

    def cells(self) -> list[Cell]:
        """Every planned cell that has a finished run to report: its own, another
        sweep's, or one finished before (unless ``rerun``)."""
        newest = ({r["name"]: r["id"] for r in store.list_runs(self.db)
                   if r["status"] == "finished"} if self.trained or self.elsewhere else {})
        out = []
        for cell in self.planned:
            name = cell.name
            ours = name in self.trained or name in self.elsewhere
            run_id = newest.get(name) if ours else self.finished.get(name)
            if run_id is not None and (ours or not self.rerun):
                out.append(Cell(cell.arm["label"], cell.profile, run_id,
                                store.summarize(self.db, run_id), cell.seed))
        return out
