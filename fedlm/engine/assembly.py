"""The one place a config becomes a ready engine: its server kind (with the strategy, built
once, and the local-steps policy the kind owns), its fleet, and whatever the caller runs it
with (a transport, a store writer, an evaluator, callbacks). The runner, the dry run, the
tests' helper and the benchmarks all assemble their engines here; replay builds the same
server kind (``fedlm.servers.build``) and drives it without an engine.
"""

from __future__ import annotations

from typing import Callable

from fedlm import servers
from fedlm.config import Config
from fedlm.engine.loop import Engine
from fedlm.engine.types import Progress, Transport
from fedlm.sim import fleet as fleet_lib


def assemble(cfg: Config, *, transport: Transport, writer=None,
             server: servers.Server | None = None, fleet: list | None = None,
             evaluate: Callable | None = None,
             progress: Callable[[Progress], None] | None = None,
             should_stop: Callable[[], bool] | None = None,
             checkpoint: Callable[[dict], None] | None = None,
             shard_sizes: list[int] | None = None) -> Engine:
    """A ready engine for ``cfg``. ``server``: the kind built for this run already (a run
    announces it and stores its summary before the engine exists), else built here;
    ``fleet``: the workers' profiles (default: the config's nodes)."""
    return Engine(cfg, server=server if server is not None else servers.build(cfg),
                  transport=transport,
                  fleet=fleet if fleet is not None else fleet_lib.node_profiles(cfg),
                  writer=writer, evaluate=evaluate, progress=progress,
                  should_stop=should_stop, checkpoint=checkpoint, shard_sizes=shard_sizes)
