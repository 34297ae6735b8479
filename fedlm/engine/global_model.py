"""The global model: the server's side of the protocol, shared by the live engine
and replay.

    dispatched(w, v)      a job of worker w starts from global version v
    apply(update)   ->    new params, or None (the strategy holds the update)
    lose(w, job, why) ->  new params, or None (e.g. a sync round closing with
                          the replies it has)
    new_version(params)   the params become global version v + 1; returns the
                          updates (by seq) that went into it
    start_params(w)       what a job of w starts from (a two-level strategy's region)
    deliver(key)    ->    a two-level strategy's server-to-server transfer arrived:
                          (new params or None, its staleness)

``GlobalModel`` owns the global params, their version, the strategy, and the
numbering of the updates handed to the strategy (``seq``) with those it still
holds; it computes each update's staleness. What a new version sets off
(evaluation, checkpoints, the store) is the caller's: the engine logs and
evaluates, replay keeps the versions later jobs start from. Both call the
strategy through here and nowhere else, so a run and its replay cannot drift
apart in how they drive it. (It was ``Driver`` in ``fedlm/engine/driver.py``:
Flower's old name for what it now calls the Grid, so it read as something else.)
"""

from __future__ import annotations

from typing import Any

from fedlm.strategies.base import Strategy, Update


class GlobalModel:
    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.params: Any = None
        self.version = 0
        self.seq = 0  # updates handed to the strategy so far
        self.held: list[int] = []  # their seqs not yet in a version

    def start(self, params, num_workers: int, regions: list[list[int]] | None = None) -> None:
        if regions is not None and self.strategy.two_level:
            self.strategy.place(regions)
        self.strategy.start(params, num_workers=num_workers)
        self.params = params

    def dispatched(self, worker: int, version: int) -> None:
        self.strategy.on_dispatch(worker, version=version)

    def update(self, *, worker: int, job_id: int, base_version: int, outer_grad,
               tokens: int, local_steps: int) -> Update:
        """The strategy's view of a finished job, with its staleness now."""
        return Update(worker=worker, job_id=job_id, base_version=base_version,
                      outer_grad=outer_grad, tokens=tokens, local_steps=local_steps,
                      staleness=self.strategy.staleness(worker, base_version, self.version))

    def apply(self, update: Update):
        self.held.append(self.seq)
        self.seq += 1
        return self.strategy.on_update(update, self.params)

    def start_params(self, worker: int):
        """What a job of ``worker`` starts from (the global params, or its region's)."""
        return self.strategy.start_params(worker, self.params)

    def deliver(self, key: int) -> tuple:
        """A two-level strategy's transfer arrived: (new params or None, staleness)."""
        return self.strategy.on_transfer(key, self.params)

    def lose(self, worker: int, *, job_id: int, reason: str):
        return self.strategy.on_job_lost(worker, job_id=job_id, reason=reason,
                                         params=self.params)

    def new_version(self, params) -> list[int]:
        self.params = params
        self.version += 1
        seqs, self.held = self.held, []
        return seqs

    def state_dict(self) -> dict:
        return {"params": self.params, "version": self.version, "seq": self.seq,
                "held": list(self.held), "strategy": self.strategy.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.params, self.version = state["params"], state["version"]
        self.seq, self.held = state["seq"], list(state["held"])
        self.strategy.load_state_dict(state["strategy"])
