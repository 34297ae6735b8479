"""One run, start to finish, over any transport: store, fleet, model, engine.

``server_app.run_on_grid`` calls it with Flower's Grid behind the transport;
``fedlm run --backend inprocess`` with the in-process trainer (one process, no
Ray: for debugging, sweeps and machines without spare cores). ``resume``
continues a run whose process died, from its newest intact checkpoint
(``resumable`` says first whether it can). ``prepare_data`` readies the data
before a run is stored, whichever transport runs it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
import uuid
from contextlib import closing
from pathlib import Path
from typing import Callable

from fedlm import servers
from fedlm import checkpoint as ckpt_lib, start as start_lib
from fedlm.store import inputs
from fedlm.store.schema import AWAY_EVENT
from fedlm.worker import batching, placement, precision, state_folders
from fedlm.sim import dynamics, fleet as fleet_lib
from fedlm.config import Config
from fedlm.engine import Diverged, Interrupted, Progress, Transport, assemble
from fedlm.evaluate import Evaluator
from fedlm.inprocess import InProcessTransport
from fedlm.params import params_hash
from fedlm.store import (RunWriter, StoreError, best_loss, connect_readonly, event_details,
                         input_pins, resumable_row, store_id)
from fedlm.shards import data_shards, shard_sizes
from fedlm.worker.states import run_folder

# connect(run_key) -> (transport, worker -> node id)
Connect = Callable[[str], tuple[Transport, dict[int, str]]]


def prepare_data(cfg: Config) -> None:
    """Tokenize the corpus once, here, not in every Ray actor at once; and cut the
    shards, so that bad data (e.g. too few documents) fails before the run is stored."""
    data_shards(cfg.data, cfg.shard_count(), cfg.seed)


def open_run(cfg: Config, db_path: str, summary: str) -> RunWriter:
    """A new run's row in the store at ``db_path``."""
    tags = "".join(f"+{tag}" for tag, _ in dynamics.features(cfg.fleet))
    return RunWriter(db_path, name=cfg.name or f"{cfg.strategy}-{cfg.fleet.preset}{tags}",
                     strategy=cfg.strategy, local_steps=cfg.local_steps,
                     profile=cfg.fleet.preset, model=cfg.model, workers=cfg.workers,
                     seed=cfg.seed, clock=cfg.clock, config_json=cfg.to_json(),
                     strategy_summary=summary)


def worker_rows(cfg: Config, fleet: list, node_of: dict | None = None,
                sizes: list[int] | None = None) -> list[dict]:
    """The ``workers`` rows of a run on ``fleet``: each worker's profile, the node that
    holds it (``node_of``; none in one process) and its own shard's sequences (0 when
    it draws shards, ``data.shard_choice = paper``, or ``sizes`` is not given)."""
    fixed = sizes is not None and cfg.data.shard_choice == "fixed"
    return [{"worker": p.worker, "node_id": None if node_of is None else str(node_of[p.worker]),
             "step_time": p.step_time, "jitter": p.jitter, "region": p.region.name,
             "latency": p.region.latency, "down_bw": p.region.down_bw, "up_bw": p.region.up_bw,
             "shard_sequences": sizes[p.worker] if fixed else 0} for p in fleet]


def execute(cfg: Config, db_path: str, connect: Connect,
            progress: Callable[[Progress], None] | None = None,
            on_start: Callable[[int], None] | None = None,
            should_stop: Callable[[], bool] | None = None,
            resume: int | None = None,
            pretrain_progress: Callable[[int, int], None] | None = None,
            server_device: str = "cpu", server: servers.Server | None = None) -> int:
    """Run ``cfg`` (or continue run ``resume``); everything lands in the run store
    at ``db_path``. Returns the run id.

    ``connect`` gets the run key (which names the workers' saved states) and
    returns the transport and, per worker, the id of the node that holds it.
    ``server_device``: where the global model, the outer optimizer's state and the
    outer step live (the run's GPU in process; the host where updates come over a wire).
    ``server``: the kind built for this run already (``fedlm run`` announces it first),
    else built here: a run builds its strategy once.
    """
    if server is None:
        server = servers.build(cfg)  # the kind of server, with its strategies
    run = _open(cfg, db_path, servers.summary(server), resume, server_device)
    writer = run.writer
    if on_start:
        on_start(writer.run_id)
    engine = transport = None
    try:
        if cfg.state_store() == "disk":  # so that `fedlm states` can tell whose they are
            state_folders.claim(run.key, db_path, writer.run_id)
            writer.add_event(kind=state_folders.CLAIM_EVENT, virtual_time=0.0, detail=run.key)
            writer.commit()  # the store confirms the folder's record even if we die now
        transport, node_of = connect(run.key)
        run.notes += _batched_mode(transport, db_path, writer.run_id,
                                   resumed=run.state is not None)
        engine, params = _engine(cfg, db_path, run, server, transport, node_of,
                                 (progress, should_stop, pretrain_progress), server_device)
        try:
            final = engine.run(params, resume=run.state)
        except SystemExit as exc:  # a plug-in's sys.exit: a failure, not the command's exit
            raise PluginExit(f"SystemExit({exc.code!r}) raised inside the run (a plug-in "
                             f"called sys.exit)") from None
        if cfg.reliability.keep_weights:  # what init.from = RUN_ID starts from
            ckpt_lib.write(ckpt_lib.weights_for(db_path, writer.run_id),
                           {"params": final, "run": run.whose})
        writer.finish(status="finished", virtual_time=engine.now, updates=engine.version,
                      final_hash=params_hash(final))
        _close(transport)  # its job threads and state writer, before the states go
        _forget(run.folder, run.key)
    except BaseException as exc:
        try:
            status = _ended_badly(exc, run, engine)  # marked first: the close may wait
        finally:
            _close(transport)
        if status == "diverged":  # resuming would only diverge again
            _forget(run.folder, run.key)
        raise
    finally:
        writer.close()
    return writer.run_id


class PluginExit(RuntimeError):
    """Code run inside the engine (a plug-in) raised SystemExit."""


@dataclass
class _Run:
    """A run opened in the store: new, or resumed from its newest checkpoint."""

    writer: RunWriter
    key: str  # names the workers' saved states
    state: dict | None  # the engine's state to go on from (None: from the start)
    notes: list  # events to log once the run goes
    origin: object  # a new run's resolved init.from
    folder: Path  # where its checkpoints go
    whose: dict  # what its checkpoints say about whose they are


def _open(cfg: Config, db_path: str, summary: str, resume: int | None,
          server_device: str) -> _Run:
    if resume is None:
        origin = start_lib.resolve(cfg, db_path)  # a bad init.from: refused before it is stored
        pinned = inputs.pins(cfg)  # the files it names, by content: read before it is stored
        writer = open_run(cfg, db_path, summary)
        inputs.record(writer, pinned)
        state, key, notes, found = None, uuid.uuid4().hex, [], None
    else:
        # a trace rewritten since the run began would finish it on another fleet
        inputs.check_unchanged(input_pins(db_path, resume), cfg, resume, "resume")
        writer = RunWriter.reopen(db_path, resume)  # refuses a run whose writer is alive
        origin = None
        away = [(AWAY_EVENT, f"{writer.away:.3f} s from the last sign of the process before to "
                       f"this resume (not run time)")]
        try:
            own = ckpt_lib.identity(writer.store_id, db_path, resume, writer.created_at)
            found = ckpt_lib.locate(db_path, resume, own)
            state, key, notes = _rewind(writer, found or ckpt_lib.folder_for(db_path, resume),
                                        server_device, states_on_disk=cfg.state_store() == "disk")
            notes = [*away, *notes]
        except BaseException:
            writer.close()
            raise
    return _Run(writer, key, state, list(notes), origin,
                found or ckpt_lib.folder_for(db_path, writer.run_id),
                ckpt_lib.identity(writer.store_id, db_path, writer.run_id, writer.created_at))


def _engine(cfg: Config, db_path: str, run: _Run, server, transport, node_of,
            callbacks, server_device: str):
    """The engine of ``run`` and the params it starts from (a new run's start point, or
    the shapes a resumed one's state fills)."""
    progress, should_stop, pretrain_progress = callbacks
    writer = run.writer
    fleet = fleet_lib.node_profiles(cfg)
    sizes = shard_sizes(cfg)
    writer.add_workers(worker_rows(cfg, fleet, node_of, sizes))
    if run.state is None:  # a new run (or a resume that starts over): where it starts
        begin = start_lib.starting_point(cfg, db_path, resolved=run.origin,
                                         progress=pretrain_progress)
        params = precision.to_device(begin.params, server_device)
        writer.set_model_info(sum(p.numel() for p in params.values()),
                              begin.initial_hash, params_hash(params))
        run.notes += begin.notes
    else:
        params = start_lib.initial(cfg)  # shapes for the strategy; the state has the rest

    def save_checkpoint(engine_state: dict) -> None:
        flush_states = getattr(transport, "flush_states", None)
        if flush_states is not None:  # the states this checkpoint resumes from, on disk
            flush_states()
        writer.commit()
        ckpt_lib.save(run.folder, engine_state["position"]["version"],
                      {"engine": engine_state, "db": writer.positions(), "run_key": run.key,
                       "run": run.whose},
                      keep=cfg.reliability.checkpoint_keep)

    engine = assemble(cfg, server=server, transport=transport, fleet=fleet, writer=writer,
                      evaluate=Evaluator(cfg), progress=progress, should_stop=should_stop,
                      checkpoint=save_checkpoint if cfg.reliability.checkpoint_every else None,
                      shard_sizes=sizes)
    for kind, detail in run.notes:
        writer.add_event(kind=kind, virtual_time=run.state["position"]["now"] if run.state
                         else 0.0, detail=detail)
    if run.state is not None:  # the evaluations before the checkpoint are the run's so far
        best = best_loss(db_path, writer.run_id)
        if best is not None:
            engine.divergence.seed(*best)
    return engine, params


def _ended_badly(exc: BaseException, run: _Run, engine) -> str:
    """Mark the run as it ended (failed, interrupted, diverged), its jobs in flight
    cancelled; returns the status."""
    status = end_status(exc)
    if engine is not None:  # its jobs in flight will never be handed on
        engine.cancel_in_flight(f"run {status}")
    run.writer.finish(status=status, virtual_time=engine.now if engine else 0.0,
                      updates=engine.version if engine else 0, final_hash=None,
                      error=str(exc) if status == "diverged" else failure_reason(exc))
    return status


def _batched_mode(transport, db_path: str, run_id: int, resumed: bool) -> list:
    """The in-process backend's ``sim.batched`` mode, as the run log keeps it: a new run
    records the mode it resolved to; a resumed one trains in the mode it recorded (the
    bits of a job depend on it), whatever this machine would resolve ``auto`` to."""
    if not hasattr(transport, "batched"):  # Flower: every job on its own
        return []
    if resumed:
        then = batching.recorded(event_details(db_path, run_id, batching.KIND))
        if then is not None:
            transport.batched = then
            return []
    return [(batching.KIND, batching.detail(transport.batched))]


def _close(transport) -> None:
    """End the in-process backend's job threads and its state writer, before a run's
    states may be deleted (a second call, after a close that raised, is a no-op)."""
    if hasattr(transport, "close"):
        transport.close()


def _forget(folder, run_key: str) -> None:
    """A run that ended for good (finished, diverged): its checkpoints and the workers'
    saved states (where they are on this machine) are of no further use."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(run_folder(run_key), ignore_errors=True)


def end_status(exc: BaseException) -> str:
    """The status of a run that ``exc`` stopped: interrupted (asked to stop), diverged
    (its validation loss blew up: ``Diverged``'s message is the run's error) or failed."""
    if isinstance(exc, Interrupted):
        return "interrupted"
    return "diverged" if isinstance(exc, Diverged) else "failed"


def failure_reason(exc: BaseException) -> str:
    """One line saying why a run stopped, for the store and the command's error."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _rewind(writer: RunWriter, folder, device: str = "cpu", states_on_disk: bool = False
            ) -> tuple[dict | None, str, list[tuple[str, str]]]:
    """Load the newest intact checkpoint of the run and cut its log back to it.

    Returns the engine state (None: no checkpoint, the run starts over), the run
    key, and events to log about it. A checkpoint of another run is refused
    (``StoreError``) before anything changes."""
    notes = []
    expect = ckpt_lib.identity(writer.store_id, writer.path, writer.run_id, writer.created_at)
    try:
        payload, path, skipped = ckpt_lib.latest(folder, expect, map_location=device)
    except ckpt_lib.ForeignCheckpoint as exc:
        raise StoreError(f"--resume: {exc}") from None
    except ckpt_lib.NoCheckpoint as exc:
        writer.rewind({"intervals": 0, "metrics": 0, "events": 0}, next_job_id=0, seq=0,
                      version=-1, in_flight=[])
        return None, uuid.uuid4().hex, [("resumed", f"from the start ({exc})")]
    notes += [("checkpoint_skipped", s) for s in skipped]
    gone = run_folder(payload["run_key"])
    if states_on_disk and not gone.is_dir():  # before the log is cut back: nothing changes
        raise StoreError(f"--resume: run {writer.run_id}'s worker states are gone from {gone} "
                         f"(`fedlm states --clean`?); its checkpoint needs them: start the "
                         f"run again")
    st = payload["engine"]
    at = st["position"]
    writer.rewind(payload["db"], next_job_id=at["next_job_id"], seq=at["seq"],
                  version=at["version"], in_flight=at["in_flight"])
    notes.append(("resumed", f"from {path.name}: version {at['version']}, op {at['op']}, "
                             f"{len(at['in_flight'])} jobs in flight re-sent"))
    return st, payload["run_key"], notes


def resume_checkpoint(db_path: str, run_id: int) -> Path | None:
    """Where ``fedlm run --resume`` of run ``run_id`` will find its checkpoints (None:
    nowhere, it starts over), asked before the run is taken over, to say so first."""
    row = resumable_row(db_path, run_id)
    with closing(connect_readonly(db_path)) as conn:
        whose = ckpt_lib.identity(store_id(conn), db_path, run_id, row["created_at"])
    return ckpt_lib.locate(db_path, run_id, whose)


IN_PROCESS = "in-process"  # the node id of a worker run in this process (the workers table)


def run_inprocess(cfg: Config, db_path: str, **kwargs) -> int:
    """``execute`` with every job run in this process (no Flower, no Ray)."""
    nodes = fleet_lib.node_count(cfg)
    return execute(cfg, db_path, lambda run_key: (InProcessTransport(cfg, run_key=run_key),
                                                  {w: IN_PROCESS for w in range(nodes)}),
                   server_device=placement.devices(cfg)[0], **kwargs)
