"""The engine: one loop for synchronous and asynchronous training (``loop``),
and the parts it is made of: what flows through it (``types``), the order
events happen in (``events``: a virtual clock or the wall clock), the replies
not yet handed on (``inbox``), the jobs in flight (``in_flight``), the workers'
lifecycle (``workers``), every store write (``runlog``), when a run has
diverged (``divergence``) and the timing of messages between servers
(``transfers``); an engine's checkpointed state is composed in ``state``. The
server side (the evaluated model, its version, the strategy and what a job is
sent) is ``fedlm.servers``, driven through ``ServerCalls`` as replay drives it. An
engine is made in one place, ``assembly.assemble``.
docs/architecture.md draws how they fit.
"""

from fedlm.engine.assembly import assemble
from fedlm.engine.jobs import data_seed
from fedlm.engine.loop import Engine
from fedlm.engine.types import (BackOnline, Diverged, EngineError, InFlight, Interrupted,
                                JobDone, Progress, JobResult, Transport)

__all__ = ["BackOnline", "Diverged", "Engine", "assemble", "EngineError", "InFlight", "Interrupted",
           "JobDone", "Progress", "JobResult", "Transport", "data_seed"]
