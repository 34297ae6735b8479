"""DES-LOC as a fedlm plug-in, its parameter side: each group of parameters is averaged
across the workers on a period of its own, and between its syncs each worker keeps
training its own copy (Iacob, Sani, Safaryan, et al., "DES-LOC: Desynced Low
Communication Adaptive Optimizers for Training Foundation Models", arXiv 2505.22549,
ICLR 2026; https://arxiv.org/abs/2505.22549, https://openreview.net/forum?id=6N2qFixxYZ).

The paper's rule (DES-LOC-Adam, M workers, local step t; E_m the plain mean over the
workers, 1/M Σ_m):

    ĝ_t^m = clip(g_t^m, ρ)
    u_{t−1}^m ← E_m[u_{t−1}^m]  if t mod K_u = 0;   u_t^m = β₁·u_{t−1}^m + (1 − β₁)·ĝ_t^m
    v_{t−1}^m ← E_m[v_{t−1}^m]  if t mod K_v = 0;   v_t^m = β₂·v_{t−1}^m + (1 − β₂)·ĝ_t^m²
    x_t^m     ← E_m[x_t^m]      if t mod K_x = 0;   x_{t+1}^m = x_t^m − η_t·u_t^m/(√v_t^m + ε)

Each state is *replaced* by the workers' mean on its own period (no outer optimizer:
the synced value is the plain average), with K_x ≤ K_u ≤ K_v; the recommended periods
are K_u = 3·K_x and K_v = 6·K_x, chosen from the states' half-lives
τ_½(β) = ln ½ / ln β (τ_½(0.9) = 6.6 steps, τ_½(0.999) = 692.8 steps). Local Adam is
K_x = K_u = K_v; DiLoCo-style "keep the states local" is K_u = K_v = ∞.

What fedlm can express, and what this file does. A fedlm job is H inner steps
(``inner.steps``) and one round of a synchronous strategy is one job per worker, so a
period here counts rounds: K = ``period`` rounds is K_x = K·H inner steps. The inner
optimizer's state never leaves the worker (docs/architecture.md, "Invariants"): the
server never sees the moments, so **K_u and K_v cannot be expressed** — every worker's
AdamW moments stay local for the whole run (K_u = K_v = ∞), the heuristic DES-LOC argues
against. What is left is the parameter side, which fedlm's seams do allow and which
this file generalises as the desync idea applied to parameter groups:

    at the close of round r (r = 1, 2, ...), for each parameter tensor n of period K_n:
        r mod K_n = 0:  x_i[n] ← mean over the round's replies j of (x_j[n] − g_j[n])
                        for every worker i (the synced value, the paper's E_m)
        otherwise:      x_i[n] ← x_i[n] − g_i[n] for each worker i that replied
                        (it keeps its own trajectory); the others keep x_i[n]

where x_i is worker i's model (its next job starts from it) and g_i = x_i − θ_i the
outer gradient of its job. K_n is ``period`` (default 1: every round, K_x = H), or
that of the first pattern of ``group_periods`` ("glob=K,glob=K", matched on the
parameter's name with ``fnmatch``) that matches n.

Who holds what: the server (``DesyncServer``, the strategy's ``default_server``) keeps
every worker's model x_i, starts each job from it, and hands the strategy the list,
which returns it updated (as ``noloco_example.PeerServer`` does). **What is evaluated**
(the version's model, hashed and reported): the mean of the models of the workers not
retired, mean_i x_i; it is the synced model itself for the groups synced that round.

Simplified, and fedlm's choices: periods in rounds, not inner steps (a sync inside a job
is not a seam); no optimizer-state sync (no seam); a round whose groups are all out of
period still makes its barrier, its version and whole-model transfers (the engine times
every job's download and upload whole); the mean is unweighted, as E_m (fedlm's DiLoCo
weights by tokens); gradient clipping is fedlm's inner loop's (``inner.*``).

    PYTHONPATH=examples fedlm run --set strategy=desloc:DesLoc --set model=tiny
    PYTHONPATH=examples fedlm run --set strategy=desloc:DesLoc --set model=tiny \\
        --set outer.group_periods='tok_emb.*=3,pos_emb.*=3'
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any

from fedlm.errors import ConfigError
from fedlm.presets import PRESETS
from fedlm.servers import Server, Serves
from fedlm.strategies import transforms as T
from fedlm.strategies.base import Update
from fedlm.strategies.rounds import Synchronous

SOURCE = ("reconstruction of Iacob et al. 2025 (arXiv 2505.22549), parameter side only: "
          "each parameter group replaced by the workers' plain mean every K rounds, local "
          "in between; the K_u, K_v moment syncs are not expressible (inner state never "
          "leaves a worker); fedlm's: periods in rounds, per-group periods by name")


def half_life(beta: float) -> float:
    """τ_½(β) = ln ½ / ln β: the steps after which an EMA of decay β has forgotten half
    (the paper's guide for the periods: K_u, K_v grow with β₁, β₂)."""
    if not 0 < beta < 1:
        raise ValueError(f"beta: must be in (0, 1), got {beta!r}")
    return math.log(0.5) / math.log(beta)


def parse_group_periods(text: str) -> list[tuple[str, int]]:
    """``"glob=K,glob=K"`` as [(glob, K), ...], in order (the first match wins)."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        pattern, sep, k = item.rpartition("=")
        try:
            period = int(k)
        except ValueError:
            period = 0
        if not sep or not pattern or period < 1:
            raise ValueError(f"outer.group_periods: want 'glob=K,glob=K' with K an "
                             f"integer >= 1 (rounds), got {item!r}")
        out.append((pattern, period))
    return out


def check_patterns(patterns: list[tuple[str, int]], names: list[str]) -> None:
    """Refuse a pattern that matches no parameter: a typo would silently be plain
    ``period``."""
    for glob, _ in patterns:
        if not any(fnmatch.fnmatchcase(n, glob) for n in names):
            raise ConfigError(f"outer.group_periods: {glob!r} matches no parameter "
                              f"(names: {', '.join(names)})")


class DesyncServer(Server):
    """One model per worker: each job starts from its worker's own model x_i; the
    strategy is handed the list and returns it updated; evaluated: mean_i x_i over the
    workers not retired."""

    serves = Serves(keeps_job_starts=True)  # a job starts from its worker's x_i, not the version

    @classmethod
    def check(cls, cfg, strategy) -> None:
        """outer.group_periods' patterns against the preset's parameter names, when the
        config loads: before any run is stored or any worker started."""
        patterns = parse_group_periods(cfg.outer.get("group_periods", ""))
        if patterns and cfg.model in PRESETS:  # an unknown preset: the model's own check
            from fedlm.model import parameter_names  # torch: only when there is a pattern

            check_patterns(patterns, parameter_names(cfg.model))

    def start_strategy(self, params, fleet: list) -> None:
        self.local = [params] * len(fleet)  # tensors are never changed in place
        self.retired: list[int] = []
        super().start_strategy(params, fleet)

    def start_of(self, worker: int):
        return self.local[worker]

    def take(self, update):
        return self._evaluated(self.strategy.on_update(update, self.local))

    def lose(self, worker: int, *, job_id: int, reason: str):
        if reason == "retired" and worker not in self.retired:
            self.retired.append(worker)
        return self._evaluated(self.strategy.on_job_lost(worker, job_id=job_id,
                                                         reason=reason, params=self.local))

    def _evaluated(self, local):
        if local is None:
            return None
        self.local = list(local)
        kept = [x for i, x in enumerate(self.local) if i not in self.retired] or self.local
        count = float(len(kept))
        return T.tree_map(lambda *x: sum(x) / count, *kept)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "local": self.local, "retired": list(self.retired)}

    def load_state_dict(self, state: dict, checkpoint: dict | None = None) -> None:
        super().load_state_dict(state, checkpoint)
        self.local, self.retired = list(state["local"]), list(state["retired"])


class DesLoc(Synchronous):
    """DES-LOC's parameter side: synchronous rounds; each parameter group is replaced by
    the workers' mean every K_n rounds and trains locally in between."""

    name = "desloc"
    source = SOURCE
    default_server = "desloc:DesyncServer"  # it hands on_update the workers' models

    def __init__(self, *, period: int = 1, group_periods: str = "") -> None:
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"outer.period: must be an integer >= 1 (rounds: K_x = "
                             f"period x inner.steps), got {period!r}")
        super().__init__()  # the rounds: every worker, every round
        self.period, self.group_periods = period, group_periods
        self.patterns = parse_group_periods(group_periods)

    def period_of(self, name: str) -> int:
        """K_n: the first matching pattern's period, else ``period``."""
        return next((k for glob, k in self.patterns if fnmatch.fnmatchcase(name, glob)),
                    self.period)

    def start(self, params, *, num_workers: int) -> None:
        check_patterns(self.patterns, list(params))  # DesyncServer.check did, on the preset
        self.periods = {n: self.period_of(n) for n in params}
        self.num_workers = num_workers

    # ``local``: every worker's model x_i (DesyncServer's ``params``), returned anew
    def close(self, replies: list[Update], local):
        closing = self.rounds.round + 1  # this round's number: 1, 2, ...
        # worker order: reproducible sums
        ends = {u.worker: T.tree_map(lambda x, g: x - g, local[u.worker], u.outer_grad)
                for u in replies}
        count = float(len(ends))
        out = []
        for i, x in enumerate(local):
            new = type(x)()
            for n, t in x.items():
                if closing % self.periods[n] == 0:  # synced: the replies' mean
                    new[n] = sum(end[n] for end in ends.values()) / count
                else:  # local: its own trajectory (or as it was, without a reply)
                    new[n] = ends[i][n] if i in ends else t
            out.append(new)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "num_workers": self.num_workers,
                "periods": self.periods}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)  # the round's (an older layout too)
        self.num_workers, self.periods = state["num_workers"], state["periods"]
        if "rounds" in state:  # a checkpoint of before Rounds counted the rounds itself
            self.rounds.round = state["rounds"]

    def summary(self) -> str:
        groups = f", groups {self.group_periods}" if self.patterns else ""
        return (f"desloc: sync rounds, parameters replaced by the workers' mean every "
                f"{self.period} round(s){groups}, local in between; optimizer states never "
                f"synced (K_u = K_v = inf: fedlm keeps them on the worker)")
