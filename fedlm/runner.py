"""One run, start to finish, over any transport: store, fleet, model, engine.

``server_app.run_on_grid`` calls it with Flower's Grid behind the transport;
``fedlm run --backend inprocess`` with the in-process trainer (one process, no
Ray: for debugging, sweeps and machines without spare cores).
"""

from __future__ import annotations

from typing import Callable

from fedlm import fleet as fleet_lib, model as model_lib
from fedlm.config import Config
from fedlm.engine import Engine, Interrupted, Progress, Transport
from fedlm.evaluate import Evaluator
from fedlm.params import params_hash, snapshot
from fedlm.store import RunWriter
from fedlm.worker import worker_shards
from strategies import registry


def execute(cfg: Config, db_path: str, connect: Callable[[], tuple[Transport, dict[int, str]]],
            progress: Callable[[Progress], None] | None = None,
            on_start: Callable[[int], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> int:
    """Run ``cfg``; everything lands in the run store at ``db_path``. Returns the run id.

    ``connect`` returns the transport and, per worker, the id of the node that
    holds it (for the store).
    """
    strategy = registry.build_strategy(cfg.strategy, cfg.outer)
    writer = RunWriter(db_path, name=cfg.name or f"{cfg.strategy}-{cfg.fleet.preset}",
                       strategy=cfg.strategy, local_steps=cfg.local_steps,
                       profile=cfg.fleet.preset, model=cfg.model, workers=cfg.workers,
                       seed=cfg.seed, mode=cfg.clock, config_json=cfg.to_json(),
                       strategy_summary=strategy.summary())
    if on_start:
        on_start(writer.run_id)
    engine = None
    try:
        transport, node_of = connect()
        fleet = fleet_lib.profiles(cfg.fleet, cfg.workers)
        shards = worker_shards(cfg.data, cfg.workers, cfg.seed)
        writer.add_workers({"worker": p.worker, "node_id": str(node_of[p.worker]),
                            "step_time": p.step_time, "jitter": p.jitter,
                            "region": p.region.name, "latency": p.region.latency,
                            "down_bw": p.region.down_bw, "up_bw": p.region.up_bw,
                            "shard_sequences": len(shards[p.worker])} for p in fleet)
        net = model_lib.build(cfg.model, cfg.data.seq_len, seed=cfg.seed)
        params = snapshot(net)
        writer.set_model_info(model_lib.num_parameters(net), params_hash(params))
        engine = Engine(cfg, strategy=strategy,
                        local_steps=registry.build_local_steps(cfg.local_steps),
                        transport=transport, fleet=fleet, writer=writer,
                        evaluate=Evaluator(cfg), progress=progress, order=cfg.clock,
                        should_stop=should_stop)
        final = engine.run(params)
        writer.finish(status="finished", virtual_time=engine.now, updates=engine.version,
                      final_hash=params_hash(final))
    except BaseException as exc:
        writer.finish(status="interrupted" if isinstance(exc, Interrupted) else "failed",
                      virtual_time=engine.now if engine else 0.0,
                      updates=engine.version if engine else 0, final_hash=None,
                      error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        writer.close()
    return writer.run_id


def run_inprocess(cfg: Config, db_path: str, **kwargs) -> int:
    """``execute`` with every job run in this process (no Flower, no Ray)."""
    from fedlm.inprocess import InProcessTransport

    return execute(cfg, db_path, lambda: (InProcessTransport(cfg),
                                          {w: "in-process" for w in range(cfg.workers)}),
                   **kwargs)
