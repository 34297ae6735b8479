"""DiLoCo with eager updates, as a fedlm plug-in: the one-outer-step overlap of Kale,
Douillard and Donchev, "Eager Updates For Overlapped Communication and Computation in
DiLoCo", 2025, arXiv 2502.12996.

In DiLoCo every worker waits at the end of its round t for the average of the round's
outer gradients. With a one-outer-step overlap it sends its outer gradient Δ_m^(t) and
starts round t + 1 at once: the average of round t arrives while round t + 1 trains.
Applying that average one step late (the naive delay) is what the paper finds loses
much; its eager update stands the worker's own fresh outer gradient in for its own
part of the average it does not have yet, and takes the others' parts from the
exchange that has just arrived, the delayed one:

    Δ̃_m^(t) = ( w_m Δ_m^(t) + Σ_{m' ≠ m} w_m' Δ_m'^(t−1) ) / Σ_m' w_m'
    θ_m^(t) = OuterOpt_m( θ_m^(t−1), Δ̃_m^(t) )

so every worker applies its own outer gradient the round it is made and the others' one
round later: each exactly once. (The paper's text and figures state it as "the local
outer gradient as a proxy, mixed with the delayed outer gradients of the other
workers"; the formula above is that rule with DiLoCo's weighting, read from its
description.) The weights w are the round's (tokens, as DiLoCo's merge); a worker with
no outer gradient yet (the first round, or back after a round away) counts as zero.

Who holds what: every worker has its own outer model θ_m and its own outer optimizer
state, since its proxy differs from the others'. The server (``EagerServer``) keeps the
θ_m and starts each worker's job from its own; the strategy keeps the optimizer states
and the last round's outer gradients. What is evaluated is the mean of the θ_m (each is
one of the fleet's models; the mean is the one a fedlm run reports and hashes).

Timing in fedlm: as the overlapped server's (``overlap_dc_example.OverlappedServer``):
a worker's first job waits for its download; every later one's exchange (its last
report up and the average down) runs behind its compute. fedlm's rounds still close
when their last reply is in, so a fast worker does not run a round ahead of a slow one
as it could in the paper's setting (it may start round t + 1 before round t closes).

    PYTHONPATH=examples fedlm run --set strategy=eager_diloco:EagerDiLoCo
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fedlm.strategies import transforms as T
from fedlm.strategies.base import Update
from fedlm.strategies.diloco import DiLoCo
from overlap_dc_example import OverlappedServer


class EagerServer(OverlappedServer):
    """The overlapped server's timing, with each worker's job starting from its own
    outer model θ_m; the strategy is handed the θ (as the models it steps) and returns
    them moved, and the evaluated model is their mean."""

    def start_strategy(self, params, fleet: list) -> None:
        self.theta = [params] * len(fleet)  # tensors are never changed in place
        super().start_strategy(params, fleet)

    def start_of(self, worker: int):
        return self.theta[worker]

    def take(self, update: Update):
        return self._moved(self.strategy.on_update(update, self.theta))

    def lose(self, worker: int, *, job_id: int, reason: str):
        return self._moved(self.strategy.on_job_lost(worker, job_id=job_id, reason=reason,
                                                     params=self.theta))

    def _moved(self, theta):
        """A round closed (``theta``: every worker's outer model now): their mean."""
        if theta is None:
            return None
        self.theta, count = theta, float(len(theta))
        return T.tree_map(lambda *p: sum(p) / count, *theta)

    state_fields = ("theta",)


SOURCE = ("reconstruction from the text of Kale et al. 2025 (arXiv 2502.12996): eager "
          "updates, a one-outer-step overlap; fedlm's: the rule with DiLoCo's token "
          "weights, the workers' mean evaluated, and a corrected variant")


class EagerDiLoCo(DiLoCo):
    """DiLoCo rounds whose outer step uses each worker's own fresh outer gradient in
    place of its part of the average still on its way (see the module's docstring)."""

    name = "eager-diloco"
    source = SOURCE
    default_server = "eager_diloco:EagerServer"  # it hands close the θ_m, not one model

    def start(self, params, *, num_workers: int) -> None:
        super().start(params, num_workers=num_workers)
        self.states = [self.opt_state] * num_workers  # each worker's outer optimizer
        self.before: dict[int, Update] = {}  # the last round's replies, by worker

    def close(self, replies: list[Update], params):
        """``params``: every worker's θ (EagerServer's); returns them each moved."""
        theta, now = list(params), {u.worker: u for u in replies}
        for m in range(len(theta)):
            proxy = self.proxy(m, now)
            if proxy is not None:
                step, self.states[m] = self.optimizer.update(proxy, self.states[m], None)
                theta[m] = T.descend(theta[m], step)
        self.before = now
        return theta

    def proxy(self, m: int, now: dict[int, Update]):
        """Worker ``m``'s stand-in for this round's average (None: it takes no step):
        the round's merge, with every other worker's part the one it had last round."""
        return self.merge([self.part(u, m) for u in now.values()]) if now else None

    def part(self, reply: Update, m: int) -> Update:
        """What worker ``m`` has of ``reply``'s part of the round's average: all of it if
        it is its own; else that worker's previous outer gradient (zero if none)."""
        if reply.worker == m:
            return reply
        last = self.before.get(reply.worker)
        if last is None:
            return replace(reply, outer_grad=T.tree_map(lambda g: g * 0.0, reply.outer_grad))
        return replace(reply, outer_grad=last.outer_grad, local_steps=last.local_steps)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "states": self.states, "before": self.before}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.states, self.before = state["states"], state["before"]

    def summary(self) -> str:
        return (f"{self.name}: sync rounds overlapping their exchange by one outer step, "
                f"each worker's own outer gradient fresh and the others' one round late, "
                f"{self.outer_summary()}; evaluated: the workers' mean")


class CorrectedEagerDiLoCo(EagerDiLoCo):
    """fedlm's variant: the worker's own outer gradient stands in for the whole average
    (not for its 1/M part of it), and the round after, when the average has come, the
    stand-in is taken back and the average put in its place:

        Δ̃_m^(t) = Δ_m^(t) + ( Δ^(t−1) − Δ_m^(t−1) )

    With SGD as outer optimizer, θ_m^(T) = θ^(0) − lr·( Σ_{t<T} Δ^(t) + Δ_m^(T) ): every
    round's average once, and only the newest replaced by the worker's own. (A worker
    away last round has no stand-in to take back; one away this round has none to put.)"""

    name = "eager-diloco-corrected"
    source = ("fedlm's variant of Kale et al. 2025's eager updates (arXiv 2502.12996): "
              "the own outer gradient stands in for the whole average, corrected a round "
              "later")

    def proxy(self, m: int, now: dict[int, Update]):
        own = now[m].outer_grad if m in now else None
        if not self.before:
            return own
        average = self.merge(list(self.before.values()))
        last = self.before.get(m)
        late = average if last is None else T.tree_map(lambda a, b: a - b, average,
                                                        last.outer_grad)
        return late if own is None else T.tree_map(lambda a, b: a + b, own, late)

    def summary(self) -> str:
        return (f"{self.name}: sync rounds overlapping their exchange by one outer step, "
                f"each worker's own outer gradient standing in for the average until it "
                f"comes, {self.outer_summary()}; evaluated: the workers' mean")
