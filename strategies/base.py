"""The Strategy interface: what the engine calls, and when.

A strategy is pure server-side math. It never sees Flower, clocks or files:
the engine hands it values and takes values back.

The engine's loop, for sync and async alike::

    strategy.start(params, num_workers=N)
    repeat:
        for each free worker w (in worker order):
            if strategy.wants_job(w, version=v):       # sync: barrier; async: always
                strategy.on_dispatch(w, version=v)
                ... job runs with the current global model (version v) ...
        next job to finish (virtual-completion order):
            new = strategy.on_update(update, params)   # update.staleness is set
            if new is not None: params = new; v += 1   # a new global version
        a job lost (error reply, rejected update, missed deadline, worker retired):
            new = strategy.on_job_lost(w, job_id=j, reason=r, params=params)
            if new is not None: params = new; v += 1   # e.g. a sync round closes

The engine reaches the strategy through a server (``fedlm.servers``): one server
for a flat strategy, as above. Other kinds (servers in regions, fragments, peers),
which the config names (``server``), own the models they serve and hand each
strategy instance they compose the model it steps; they too call only the methods
below. A strategy may name its own kind in a class attribute ``default_server``,
which a config that names none gets (as ``default_local_steps`` for the policy; the
traits a strategy may declare: ``fedlm.strategies.traits``); it then runs only on
that kind or one made from it (``fedlm.servers.checks``).

How many local steps a job gets is a separate policy (``fedlm.strategies.local_steps``),
so any strategy combines with any policy.

State: whatever a strategy keeps between calls (momentum, buffers, counters)
lives on ``self`` and must round-trip through ``state_dict`` /
``load_state_dict`` (tensors, numbers, strings, and dicts/lists/tuples of them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar


class _Dropped:
    """What ``on_update`` returns for an update it will never apply (a closed round's)."""

    def __repr__(self) -> str:
        return "DROPPED"


DROPPED = _Dropped()  # the store then keeps the update as never applied, not as held


@dataclass(frozen=True)
class FleetFacts:
    """What a strategy may know of the run's fleet, told once before ``start``
    (``Strategy.on_fleet``): nothing it could read from a clock or a file."""

    seed: int  # the run's seed: a strategy's own draws come from it (replay repeats them)
    step_times: tuple[float, ...]  # each worker's nominal seconds per inner step
    inner_steps: int = 0  # the run's H (inner.steps): what a job's steps are measured by
    # each worker's own shard's sequences (None: shards are not workers'), read when asked
    data_sizes: Callable[[], list[int] | None] = lambda: None


@dataclass(frozen=True)
class Update:
    """One worker's finished job, as the strategy sees it."""

    worker: int  # worker index (partition id)
    job_id: int  # engine-wide job number
    base_version: int  # global model version the job started from
    outer_grad: Any  # OrderedDict[str, Tensor]: θ_start − θ_end (fedlm.params)
    tokens: int  # tokens the job trained on
    local_steps: int  # inner steps the job ran
    staleness: int  # global version now − base_version


class Strategy(ABC):
    """Base class of every aggregation strategy."""

    name: ClassVar[str] = ""  # registry name, e.g. "diloco"
    # One line, read by `fedlm strategies`: "follows PAPER: what" where the rule is the
    # paper's (its units, weights, constants), "reconstruction of PAPER: what was chosen"
    # where the paper leaves parts open or they could not be read, "fedlm's own: ...".
    source: ClassVar[str] = ""
    # What else a strategy may declare about itself (synchronous, wants_grace,
    # default_server, default_local_steps, refused_local_steps): class attributes read
    # in one place, ``fedlm.strategies.traits``

    def on_fleet(self, facts: FleetFacts) -> None:
        """The run's fleet, told once before ``start`` (speeds, the seed for draws of its
        own, each worker's data): where a strategy learns what its servers know."""

    @abstractmethod
    def start(self, params, *, num_workers: int) -> None:
        """Called once before the first job with the initial global model."""

    @abstractmethod
    def wants_job(self, worker: int, *, version: int) -> bool:
        """Whether free ``worker`` gets a job now, from global ``version``."""

    def on_dispatch(self, worker: int, *, version: int) -> None:
        """``worker`` was given a job that starts from global ``version``."""

    def on_job_lost(self, worker: int, *, job_id: int, reason: str, params) -> Any | None:
        """A job of ``worker`` is lost; nothing arrives for it. ``reason``:

        - ``"error"``: the worker's reply was an error (crash, unreachable node);
        - ``"rejected"``: its update failed the boundary checks (NaN, shape, ...);
        - ``"deadline"``: it missed its deadline (a hung or far too slow worker);
        - ``"retired"``: the worker failed too often in a row and gets no more jobs.

        The worker is free again unless retired (or offline for a while). Return
        new global params to make a version now (a sync round closing with the
        replies it has), else None."""
        return None

    @abstractmethod
    def on_update(self, update: Update, params) -> Any | None:
        """Take one finished job. Return the new global params, or None to hold
        the update (e.g. until the round's barrier or a buffer fills), or ``DROPPED``
        for one it will never apply (an over-committed round's late reply)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: momentum, buffers, counters."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def summary(self) -> str:
        """One line of settings, shown in logs and `fedlm runs`."""
        return self.name


def check_outer_sgd(lr: float, momentum: float) -> None:
    """Range checks of an outer SGD's settings (``outer.lr``, ``outer.momentum``)."""
    if lr <= 0:
        raise ValueError(f"outer.lr: must be > 0, got {lr!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"outer.momentum: must be in [0, 1), got {momentum!r}")


def momentum_text(momentum: float, nesterov: bool) -> str:
    """The momentum part of a summary line: ", momentum 0.9 nesterov", or "" without."""
    return f", momentum {momentum}{' nesterov' if nesterov else ''}" if momentum else ""
