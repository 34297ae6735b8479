"""The report of a sweep: tables and plots from the run store, no training.

``write_report`` writes the spec's markdown report and its PNG plots: final
validation perplexity per arm × profile laid out like the paper's table (with the
paper's numbers beside ours), the virtual time each run needed, the virtual time to
reach the reference's final perplexity, idle fractions, and perplexity against
virtual time and against updates.

Over several seeds (``seeds`` in the spec, ``--seeds N``) each number is the mean
over seeds with the half-width of its 95% interval (``fedlm.sweep.uncertainty``), and
every comparison with the reference is paired: each seed against the reference's
run of the same profile and seed. The plots draw the mean curve of such an arm
with a band from its lowest to its highest seed. A sweep without seeds (one run
per cell) reports plain numbers, as it always has.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fedlm import store
from fedlm.sweep import fairness, frontier, plots, tuning
from fedlm.sweep.cells import (ONE_SEED, SEEDED, final_gap, seconds_format, short_hash, shown,
                               span)
from fedlm.sweep.curves import GRID_NOTE, first_reaching, resolution, run_curve
# re-exported: experiments/compare.py reads them from here
from fedlm.sweep.curves import time_to_reach, value_at  # noqa: F401
from fedlm.sweep.plots import by_seed, groups_of
from fedlm.sweep.run import Cell, Failure, SweepResult
from fedlm.sweep.spec import cells_of, reference_of, seeds_of
from fedlm.store.yardstick import yardstick
from fedlm.sweep.uncertainty import Estimate, estimate, paired_estimate, ratio, \
    relative_difference

Group = dict  # seed -> Cell: one arm on one profile, every seed that finished


def write_report(spec: dict, result: SweepResult) -> tuple[str, list[Path]]:
    """Write the report of ``result``'s cells to the spec's ``out`` (markdown), its
    plots beside it (PNG). Returns the report's text and the files written."""
    out = Path(spec["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    pngs = plots.plot(spec, result.cells, out.with_suffix(""))
    page = _Report(spec, result.cells, result.failures, result.not_run)
    fronts = frontier.plot(page, out.with_suffix(""))
    text = page.markdown()
    text += "\n## Plots\n\n"
    if _seeded(spec):
        text += f"In the plots {plots.BAND_NOTE}.\n\n"
    text += "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n"
    if fronts:
        text += f"\n### The frontier\n\n{frontier.NOTE}\n\n"
        text += "\n".join(f"![{p.stem}]({p.name})" for p in fronts) + "\n"
    out.write_text(text)
    return text, [out, *pngs, *fronts]


def _seeded(spec: dict) -> bool:
    """Whether the spec (or --seeds) names seeds: then the report gives intervals."""
    return any(c.seed is not None for c in cells_of(spec))


def report(spec: dict, cells: list[Cell], failures: list[Failure] = (),
           not_run: list[str] = ()) -> str:
    """The sweep's markdown report: the tables of every metric, arm by profile."""
    return _Report(spec, cells, failures, not_run).markdown()


class _Report:
    """What every table of a report reads: the spec, the finished cells grouped by arm
    and profile, their curves, and how each arm compares with its reference."""

    def __init__(self, spec: dict, cells: list[Cell], failures: list[Failure],
                 not_run: list[str]) -> None:
        self.spec = spec
        self.failures = failures
        self.not_run = not_run
        self.db = spec["db"]
        self.profiles = spec["profiles"]
        self.arms = [a["label"] for a in spec["arm"]]
        self.arm_of = {a["label"]: a for a in spec["arm"]}
        self.ref = next(a["label"] for a in spec["arm"] if a.get("reference"))
        self.paper = spec.get("paper", {})
        self.paper_profiles = spec.get("paper_profiles", self.profiles)
        self.groups = groups_of(cells)
        self.planned = {(c.arm["label"], c.profile) for c in cells_of(spec)}
        self.ended: dict[tuple[str, str], str] = {}  # no seed finished: failed | diverged
        reported = {c.name for c in cells_of(spec)}  # not a tuning run's failure
        for f in (f for f in failures if f.name in reported):
            key = (f.arm, f.profile)
            self.ended[key] = f.status if self.ended.get(key, f.status) == f.status \
                else "failed"
        self.own_refs = any(a.get("against") for a in spec["arm"])
        self.seeded = _seeded(spec)
        self.curves = {c.run_id: run_curve(self.db, c.run_id) for c in cells}
        self.work = {c.run_id: store.tokens_curve(self.db, c.run_id) for c in cells}
        self.yardsticks = {c.run_id: yardstick(self.db, c.run_id) for c in cells}
        self.starts = fairness.differing_starts(cells)
        self.deadline = spec.get("deadline")  # the equal-time point, else each pair's sooner end
        self.whose = "its reference's" if self.own_refs else f"{self.ref}'s"

    # -- the frame of a table --------------------------------------------------------
    def n_planned(self, arm: str) -> int:
        return len(seeds_of(self.spec, self.arm_of[arm]))

    def table(self, title: str, fmt: Callable[[str, Group], str], with_paper: bool = False,
              note: str = "") -> list[str]:
        head = "| arm | " + " | ".join(self.profiles) + " |"
        if with_paper:
            head += " paper: " + " / ".join(self.paper_profiles) + " |"
        lines = [f"### {title}", "", *([note, ""] if note else []), head,
                 "|---|" + "---|" * (len(self.profiles) + (1 if with_paper else 0))]
        for arm in self.arms:
            row = f"| {arm} | " + " | ".join(self.cell(arm, p, fmt) for p in self.profiles) + " |"
            if with_paper:
                nums = self.paper.get(arm)
                row += (" " + " / ".join(f"{x:.2f}" for x in nums) if nums else " –") + " |"
            lines.append(row)
        return lines + [""]

    def cell(self, arm: str, profile: str, fmt: Callable[[str, Group], str]) -> str:
        if (arm, profile) in self.groups:
            return fmt(arm, self.groups[(arm, profile)])
        if (arm, profile) in self.planned:
            return self.ended.get((arm, profile), "not run")
        return "–"

    def of(self, group: Group, value: Callable[[Cell], float]) -> Estimate:
        return estimate(value(c) for _, c in sorted(group.items(), key=by_seed))

    def ref_group(self, arm: str, group: Group) -> Group:
        profile = next(iter(group.values())).profile
        return self.groups.get((reference_of(self.spec, self.arm_of[arm]), profile), {})

    def vs_ref(self, arm: str, group: Group, value: Callable[[Cell, Cell], float | None]
               ) -> tuple[dict, int]:
        """``value(cell, its reference's cell of the same seed)`` per seed where both
        finished and it is defined, and how many seeds had both."""
        rg = self.ref_group(arm, group)
        both = [s for s in group if s in rg]
        vals = {s: value(group[s], rg[s]) for s in both}
        return {s: v for s, v in vals.items() if v is not None}, len(both)

    def start_mark(self, arm: str, group: Group) -> str:
        """`` ≠start (k of n)`` where k of the n seeds paired with the reference began
        from other weights than its run: that comparison is not of the method alone."""
        rg = self.ref_group(arm, group)
        both = [s for s in group if s in rg]
        odd = [s for s in both if not fairness.same_start(group[s], rg[s])]
        return f" ≠start ({len(odd)} of {len(both)})" if odd else ""

    def clocks(self, arm: str, group: Group, time: bool) -> str:
        """Arm and reference at equal work (tokens) or at equal virtual time, per seed:
        ``arm vs reference (gap)``, means over seeds."""
        def one(c: Cell, r: Cell):
            if time:
                return fairness.at_equal_time(self.work[c.run_id], c.summary.virtual_time,
                                              self.work[r.run_id], r.summary.virtual_time,
                                              self.deadline)
            return fairness.at_equal_work(self.work[c.run_id], self.work[r.run_id])
        pairs, both = self.vs_ref(arm, group, one)
        pairs = {s: p for s, p in pairs.items() if None not in (p.arm, p.reference)}
        if not pairs:
            return "-" if both == 0 else "no evaluation"
        a = estimate(p.arm for p in pairs.values())
        r = estimate(p.reference for p in pairs.values())
        gap = estimate(relative_difference(p.arm, p.reference) for p in pairs.values())
        at = estimate(p.point for p in pairs.values())
        unit = f"{at.mean:{seconds_format(group)}} s" if time else f"{at.mean:,.0f} tokens"
        return (f"{a.mean:.3f} vs {r.mean:.3f} ({shown(gap, '+.1f', self.seeded, unit='%')}; "
                f"at {unit})" + self.start_mark(arm, group))

    # -- the metrics: one cell of a table each -----------------------------------------
    def final(self, arm: str, group: Group) -> str:
        est = self.of(group, lambda c: c.summary.final_perplexity)
        if not self.seeded or est.sd is None:
            return shown(est, ".3f", self.seeded)
        return f"{est.mean:.3f} ± {est.half_width:.3f} (sd {est.sd:.3f}, n={est.n})"

    def gap(self, arm: str, group: Group) -> str:
        est = final_gap(group, self.ref_group(arm, group))
        return shown(est, "+.1f", self.seeded, self.n_planned(arm), "%") + \
            self.start_mark(arm, group)

    def time_needed(self, arm: str, group: Group) -> str:
        return shown(self.of(group, lambda c: c.summary.virtual_time), seconds_format(group),
                     self.seeded, self.n_planned(arm))

    def time_ratio(self, arm: str, group: Group) -> str:
        rg = self.ref_group(arm, group)
        est = paired_estimate({s: c.summary.virtual_time for s, c in group.items()},
                              {s: c.summary.virtual_time for s, c in rg.items()}, ratio)
        return shown(est, ".2f", self.seeded, self.n_planned(arm), "x") + \
            self.start_mark(arm, group)

    def reach(self, arm: str, group: Group, as_ratio: bool = False) -> str:
        """When the arm first reached its reference's final perplexity (virtual s, or
        as a fraction of the time the reference itself needed), per seed."""
        def one(c: Cell, r: Cell) -> float | None:
            t = first_reaching(self.curves[c.run_id], r.summary.final_perplexity)
            if t is None or not as_ratio:
                return t
            return t / r.summary.virtual_time
        vals, both = self.vs_ref(arm, group, one)
        if both == 0:
            return "-"
        if not vals:  # its run ended first: at its step budget, equal work
            return "never within its run (equal work)" + self.start_mark(arm, group)
        fmt = ".2f" if as_ratio else seconds_format(group)
        # each time is known to the spacing of its run's evaluations: the coarsest said
        scale = {s: self.ref_group(arm, group)[s].summary.virtual_time if as_ratio else 1.0
                 for s in vals}
        grid = max(resolution(self.curves[group[s].run_id], t * scale[s]) / scale[s]
                   for s, t in vals.items())
        known = f" (grid {grid:{fmt}})"
        if not self.seeded:
            return f"{vals[next(iter(vals))]:{fmt}}" + known
        if len(vals) == both:
            return shown(estimate(vals.values()), fmt, self.seeded) + known + \
                self.start_mark(arm, group)
        est = estimate(vals.values())
        text = f"{est.mean:{fmt}}" if est.half_width is None \
            else f"{est.mean:{fmt}} ± {est.half_width:{fmt}}"
        return f"{text}{known} ({len(vals)} of {both} reached)" + self.start_mark(arm, group)

    def bound(self, arm: str, group: Group) -> str:
        """The run's virtual time over its fleet's least time for its steps, and goodput."""
        ys = [self.yardsticks[c.run_id] for _, c in sorted(group.items(), key=by_seed)]
        ratios = [y.ratio for y in ys if y.ratio is not None]
        if not ratios:
            return "-"
        times = shown(estimate(ratios), ".2f", self.seeded, self.n_planned(arm), "x")
        return f"{times}; goodput {shown(estimate(100 * y.goodput for y in ys), '.0f', False)}%"

    def time_spent(self, arm: str, group: Group) -> str:
        """Where present worker time went: useful / never applied / communication / idle;
        a sampled arm's not-drawn time after them (a share of the time there, not present:
        ``fedlm.store.yardstick``)."""
        ys = [self.yardsticks[c.run_id] for c in group.values()]
        parts = ("goodput", "unapplied", "communication", "idle")
        if not any(getattr(y, p) for y in ys for p in parts):  # no worker time stored
            return "-"

        def mean(p: str) -> float:
            return sum(getattr(y, p) for y in ys) / len(ys) * 100

        spent = " / ".join(f"{mean(p):.0f}" for p in parts)
        return spent + (f"; not drawn {mean('not_drawn'):.0f}" if any(y.not_drawn for y in ys)
                        else "")

    def idle(self, arm: str, group: Group) -> str:
        return shown(self.of(group, lambda c: 100 * c.summary.idle_fraction), ".1f",
                     self.seeded, self.n_planned(arm), "%")

    def counts(self, arm: str, group: Group) -> str:
        cs = list(group.values())
        return (f"{span([c.summary.updates for c in cs])} / "
                f"{span([c.summary.local_steps for c in cs])}")

    def ids(self, arm: str, group: Group) -> str:
        cs = [c for _, c in sorted(group.items(), key=by_seed)]
        wall = sum(c.summary.wall_time for c in cs) / len(cs)
        sep = "; " if self.seeded else ", "  # "#2, #4; 7": the ids, then the time
        return ", ".join(f"#{c.run_id}{short_hash(c)}" for c in cs) + f"{sep}{wall:,.0f}"

    # -- the page ----------------------------------------------------------------------
    def markdown(self) -> str:
        return "\n".join([*self.header(), *self.tables(), *self.footer()])

    def header(self) -> list[str]:
        spec = self.spec
        out = [f"# {spec.get('title', 'Sweep')}", "", spec.get("description", "").strip(), "",
               f"Run store: `{self.db}` (run ids in the last table). Reference (sync): "
               f"**{self.ref}**" + (" (an arm with `against` is compared with the arm it "
                                    "names)." if self.own_refs else "."), ""]
        if self.not_run:
            out += [f"**{len(self.not_run)} of {len(cells_of(spec))} planned runs were not "
                    "run** (report written with `--report-only`; they are listed at the "
                    "end): a cell shows `not run` where none of its seeds ran, `(n=k)` "
                    "where k did.", ""]
        if spec.get("arms_only"):
            out += [f"Arms limited to those whose label contains "
                    f"{' or '.join(repr(t) for t in spec['arms_only'])} (`--arms`), with the "
                    f"arms they are compared with.", ""]
        out += self.starts_warning()
        if self.seeded:
            seeds = sorted({c.seed for c in cells_of(spec)})
            return out + [f"Seeds: {', '.join(map(str, seeds))}; {SEEDED}", ""]
        return out + [ONE_SEED, ""]

    def starts_warning(self) -> list[str]:
        """The seeds whose arms began from different weights, arm by start."""
        if not self.starts:
            return []
        out = ["**Arms of one seed started from different weights** (`init`: a run's "
               "pretraining or `init.from`); a comparison resting on such a pair is marked "
               "`≠start` and measures more than the method:", ""]
        for (profile, seed), starts in sorted(self.starts.items(), key=str):
            groups = "; ".join(f"`{h[:12]}`: {', '.join(arms)}" for h, arms in starts.items())
            out.append(f"- {profile}" + ("" if seed is None else f", seed {seed}") + f": {groups}")
        return out + [""]

    def tables(self) -> list[str]:
        t, whose, seeded = self.table, self.whose, self.seeded
        return [
            *t("Final validation perplexity", self.final, with_paper=bool(self.paper),
               note="mean ± 95% interval (sd: across seeds)" if seeded else ""),
            *t(f"Per-update gap: final perplexity against {whose} (equal inner steps "
               f"where every run spends one budget)", self.gap),
            *t(f"At equal work: perplexity against {whose}, both at the fewer tokens of "
               f"the two runs", lambda a, g: self.clocks(a, g, time=False)),
            *t(f"At equal virtual time: perplexity against {whose}, both at " +
               (f"the deadline, {self.deadline:g} s" if self.deadline is not None
                else "the sooner of the two runs' ends"),
               lambda a, g: self.clocks(a, g, time=True)),
            *t("Virtual time the run needed (s)", self.time_needed),
            *t(f"... as a ratio to {whose} (below 1: sooner)", self.time_ratio),
            *t(f"Virtual time to reach {whose} final perplexity (s)", self.reach,
               note=("mean over the seeds that reached it (those that did not are left "
                     "out, so the mean is optimistic); " if seeded else "") + GRID_NOTE),
            *t("... as a fraction of the reference's own time (below 1: sooner)",
               lambda a, g: self.reach(a, g, as_ratio=True), note=GRID_NOTE),
            *t("Virtual time over the fleet's bound (the least time its workers need for "
               "the run's steps), and goodput", self.bound,
               note="bound: every worker computing all the time it is there but for one "
                    "round trip (fedlm/sim/bound.py); goodput: useful compute over present "
                    "worker time (mean over seeds)"),
            *t("Where present worker time went (%): useful compute / compute never applied "
               "/ communication / idle", self.time_spent,
               note="mean over seeds; never applied: lost when a worker left or failed, "
                    "dropped as late or stale, or still running at the end" + (
                        "; not drawn: left out of a sampled round, a % of the time the "
                        "workers were there; not present time, so in neither idle nor "
                        "goodput" if any(y.not_drawn for y in self.yardsticks.values())
                        else "")),
            *t("Idle fraction (all workers)", self.idle),
            *t("Updates applied / local steps", self.counts,
               note="lowest–highest over seeds" if seeded else ""),
            *t("Run id and real time (s)" if not seeded
               else "Run ids (by seed) and mean real time (s)", self.ids,
               note="each run's final weights' hash (its first 8 digits) in brackets: an "
                    "outside re-run is checked against it")]

    def footer(self) -> list[str]:
        spec = self.spec
        out = tuning.section(spec) + ["### Arms", ""] + [
            f"- **{a['label']}**: `{' '.join(a['set'])}`"
            + (f" (against {a['against']})" if a.get("against") else "")
            + (f" (only {', '.join(a['profiles'])})" if "profiles" in a else "")
            + (f" (seeds {', '.join(map(str, a['seeds']))})" if "seeds" in a else "")
            + (f" (tuned on {', '.join(sorted(tuning.flat(a['tune'])))})" if a.get("tune")
               else "")
            + (f" (composed of: {', '.join(a['parts_of'])}; each alone below)"
               if a.get("parts_of") else "")
            + (f" (one part of {a['part_of']})" if a.get("part_of") else "")
            for a in spec["arm"]]
        out += ["", f"Shared: `{' '.join(spec.get('base', []))}`", ""]
        if self.failures:
            out += ["### Failed runs", ""] + [f"- **{f.name}**: {f.reason}"
                                              for f in self.failures] + [""]
        if self.not_run:
            out += ["### Not run", ""] + [f"- {name}" for name in self.not_run] + [""]
        if spec.get("discussion"):
            out += ["## Reading", "", spec["discussion"].strip(), ""]
        return out
