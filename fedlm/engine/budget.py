"""The local-step budget (``local_step_budget``): how many inner steps the next job
gets, and when nobody gets one. Functions of the engine, as ``state`` is."""

from __future__ import annotations

from typing import Any


def steps_for(engine: Any, w: int) -> int:
    """Inner steps of ``w``'s next job: the local-steps policy's, within the local-step
    budget (0: no job). A synchronous round is handed out whole while the budget
    is not spent, so the run ends on a whole round; an asynchronous job gets at most
    the steps not yet spent nor in flight, so the run ends on the budget exactly."""
    steps = engine.model.job_steps(w, engine.version, engine.policy)
    budget = engine.cfg.local_step_budget
    if not budget:
        return steps
    if engine.strategy.synchronous:
        return steps if engine.steps_done < budget else 0
    return max(0, min(steps, budget - engine.steps_done - engine.in_flight.steps()))


def spent(engine: Any) -> bool:
    """``steps_for`` gives every worker 0 now: the budget is spent (synchronous), or
    spent and in flight (asynchronous)."""
    budget = engine.cfg.local_step_budget
    in_flight = 0 if engine.strategy.synchronous else engine.in_flight.steps()
    return budget > 0 and engine.steps_done + in_flight >= budget
