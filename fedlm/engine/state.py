"""An engine's checkpointed state: each part's own, and the loop's totals.

``Engine.state_dict()`` is ``capture(engine)``, taken at the top of the loop where
the whole state is in it; ``Engine.load_state_dict`` is ``restore``. The keys:

    model          the server (``fedlm.servers.ServerCalls.state_dict``): params,
                   version, seq, held updates, the strategy's state, what each worker
                   last saw and whatever else its kind keeps (``driver`` in checkpoints
                   written before the class was renamed: still read)
    policy, grace, pool, events, inbox, log, jobs, stall
                   each part's own ``state_dict`` (no ``grace`` in checkpoints
                   written before the grace rule kept state, no ``stall`` before the
                   progress watch)
    in_flight      job id -> InFlight, in dispatch order
    base_params    the global versions that jobs in flight started from (resume
                   sends them again; a job of a server that keeps job starts carries
                   its own)
    transfers      messages between servers on their way (their arrivals are on the
                   event clock)
    timers         wake-ups a server kind asked for, not yet rung (on the event clock)
    model_bytes, up_bytes, tokens, steps_done, jobs_done, last_perplexity,
    last_eval_version   the loop's payload sizes and totals
    position       where the run stands, for the store to be cut back to it
"""

from __future__ import annotations

import time

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the types only: this module imports none of them at run time
    from fedlm.engine.events import VirtualEvents, WallEvents
    from fedlm.engine.grace import NoGrace
    from fedlm.engine.in_flight import InFlightJobs
    from fedlm.engine.inbox import Inbox
    from fedlm.engine.jobs import JobMaker
    from fedlm.engine.runlog import RunLog
    from fedlm.engine.stall import StallWatch
    from fedlm.engine.timers import ServerTimers
    from fedlm.engine.transfers import ServerTransfers
    from fedlm.engine.types import Transport
    from fedlm.engine.workers import WorkerPool
    from fedlm.servers import ServerCalls
    from fedlm.strategies.local_steps import LocalSteps


class Engine(Protocol):
    """What this module reads and sets of an engine (``fedlm.engine.loop.Engine``): its
    parts, its totals, where it stands."""

    server: ServerCalls
    policy: LocalSteps
    grace: NoGrace  # or a subclass: the fixed or the adaptive window
    pool: WorkerPool
    events: VirtualEvents | WallEvents
    inbox: Inbox
    log: RunLog
    jobs: JobMaker
    in_flight: InFlightJobs
    stall: StallWatch
    transfers: ServerTransfers
    timers: ServerTimers
    transport: Transport
    base_params: dict[int, Any]  # version -> the params jobs in flight started from
    last_eval_version: int
    wall_start: float  # time.time() its evaluations' wall times count from
    model_bytes: int
    up_bytes: int
    tokens: int
    steps_done: int
    jobs_done: int
    last_perplexity: float | None

    @property
    def version(self) -> int: ...

    @property
    def now(self) -> float: ...

PARTS = ("policy", "grace", "pool", "events", "inbox", "log", "jobs", "in_flight", "stall")
TOTALS = ("model_bytes", "up_bytes", "tokens", "steps_done", "jobs_done", "last_perplexity")


def capture(engine: Engine) -> dict:
    """``engine``'s state (an ``Engine``, at the top of its loop)."""
    st = {name: getattr(engine, name).state_dict() for name in PARTS}
    st["model"] = engine.server.state_dict()
    st.update({name: getattr(engine, name) for name in TOTALS})
    st["transfers"] = engine.transfers.state_dict()
    st["timers"] = engine.timers.state_dict()
    return {**st, "base_params": dict(engine.base_params),
            "last_eval_version": engine.last_eval_version,
            "wall_elapsed": time.time() - engine.wall_start,  # goes on from here on resume
            "position": position(engine, st["model"]["seq"])}


def restore(engine: Engine, st: dict) -> None:
    """Put ``engine`` where ``capture`` found it (in a checkpoint of this or an older
    version of fedlm)."""
    engine.server.load_state_dict(st["model"] if "model" in st else st["driver"], st)
    engine.policy.load_state_dict(st["policy"])
    engine.in_flight.load_state_dict(st["in_flight"])
    engine.grace.load_state_dict(st.get("grace", {}), engine.in_flight)  # it indexes them
    for name in ("pool", "events", "inbox", "log", "jobs"):
        getattr(engine, name).load_state_dict(st[name])
    engine.stall.load_state_dict(st.get("stall", {}))
    for name in TOTALS:
        setattr(engine, name, st[name])
    engine.transfers.load_state_dict(st.get("transfers", {"flying": {}}))
    engine.timers.load_state_dict(st.get("timers", {"pending": {}}))  # older: none set
    engine.base_params = dict(st["base_params"])
    engine.last_eval_version = st["last_eval_version"]
    engine.wall_start = time.time() - st.get("wall_elapsed", 0.0)  # older: from 0 again
    engine.events.set_payload(engine.model_bytes, engine.up_bytes)


def position(engine: Engine, seq: int) -> dict:
    """Where a checkpointed run stands, for the store to be cut back to it on resume
    (``seq``: the updates handed to the strategy so far)."""
    return {"version": engine.version, "op": engine.log.op, "seq": seq,
            "next_job_id": engine.jobs.next_job_id, "in_flight": engine.in_flight.ids(),
            "now": engine.now}


def resubmit(engine: Engine) -> None:
    """Send the jobs in flight at the checkpoint again, each with what it carried."""
    for f in engine.in_flight.flights():
        engine.transport.submit(f.job, engine.server.resend(f, engine.base_params))
