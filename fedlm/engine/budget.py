"""The local-step budget (``local_step_budget``): how many inner steps the next job
gets, and when nobody gets one."""

from __future__ import annotations


class StepBudget:
    """``budget`` inner steps in all (0: no budget). A synchronous round is handed out
    whole while the budget is not spent, so the run ends on a whole round; an
    asynchronous job gets at most the steps not yet spent nor in flight, so the run ends
    on the budget exactly."""

    def __init__(self, budget: int, synchronous: bool) -> None:
        self.budget = budget
        self.synchronous = synchronous

    def allow(self, steps: int, done: int, in_flight: int) -> int:
        """Inner steps of a job the policy sized at ``steps``, with ``done`` steps
        handed to the strategy and ``in_flight`` in jobs still running (0: no job)."""
        if not self.budget:
            return steps
        if self.synchronous:
            return steps if done < self.budget else 0
        return max(0, min(steps, self.budget - done - in_flight))

    def spent(self, done: int, in_flight: int) -> bool:
        """``allow`` gives every worker 0 now: the budget is spent (synchronous), or
        spent and in flight (asynchronous)."""
        held = 0 if self.synchronous else in_flight
        return self.budget > 0 and done + held >= self.budget

    def over(self, done: int, busy: bool) -> bool:
        """Every step of the budget handed to the strategy and nothing ``busy`` (no job in
        flight, nor, for a server kind whose messages carry updates, a message: its
        ``drains_messages``): the run is over."""
        return self.budget > 0 and done >= self.budget and not busy
