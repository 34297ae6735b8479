"""Replay a run from its operation log, in one process.

The log (tables ``jobs`` and ``updates``, ordered by op number) says which job
was dispatched to which worker from which model version with which data seed
and how many local steps, which jobs were lost, and in which order finished
jobs reached the strategy. Replay walks it:

    dispatch op  -> ServerCalls.dispatch: what the job is sent (the strategy hears
                    of it, as in the run); before a round's first, the workers its
                    round was drawn from (a ``round_drawn`` event), offered again
    lost op      -> ServerCalls.lost; a version if the strategy makes one (a sync
                    round closing with what it had)
    transfer op  -> ServerCalls.arrived: a message between servers arrives; a
                    version if the evaluated model changed
    timer op     -> ServerCalls.rang: a wake-up the server kind asked for rings (a
                    ``timer`` event); a version if the evaluated model changed
    update op    -> run the job again (worker.run_job) from what it was sent, with
                    the worker state it started from (the job records which:
                    ``prev_job``), on the data shard and at the schedule position it
                    was given (``shard``, ``schedule_step``), in the run's
                    ``sim.batched`` mode (its log's ``batched`` event), and hand it
                    on (ServerCalls.finished) with the recorded staleness

It drives the run's own kind of server through the engine's calls (``fedlm.servers``:
``ServerCalls``, which holds the order of each event's calls), so a run and its
replay hand updates, lost jobs, messages and new versions to the strategy the same
way, and send each job what the run sent it. It starts from the run's
recorded start: the seeded model, ``init.from``'s weights and pretraining,
recomputed (``fedlm.start``) and checked against the hashes in the ``runs``
row; it ends with the final weights' hash, to compare with the recorded one.
The order came from the log, so it does not matter whether the run's order came
from a virtual clock or from real arrival times. Only what the jobs still to be
replayed were sent (versions of the model, or their own starts) is kept in memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from fedlm.sim import fleet
from fedlm import model as model_lib, start
from fedlm.store import inputs
from fedlm.worker import precision
from fedlm.config_load import from_json
from fedlm import servers
from fedlm.errors import ConfigError
from fedlm.params import params_hash, same_update
from fedlm.store import StoreError, event_details, input_pins, operation_log, replayable_row
from fedlm.sim import compression, link_codecs
from fedlm.engine.runlog import ROUND_DRAWN, TIMER_EVENT
from fedlm.job import JobSpec
from fedlm.worker import batching
from fedlm.worker.batched import job_updates as batched_updates
from fedlm.worker.train import job_update
from fedlm.worker.states import MemoryStates


@dataclass(frozen=True)
class ReplayResult:
    run_id: int
    recorded_hash: str | None
    replayed_hash: str
    versions: int
    updates: int
    mismatched_updates: int  # updates whose outer-gradient hash differed from the log
    max_versions_held: int

    @property
    def identical(self) -> bool:
        return self.recorded_hash == self.replayed_hash


class ReplayError(RuntimeError):
    pass


def replay(db: str | Path, run_id: int,
           progress: Callable[[int, int], None] | None = None,
           pretrain_progress: Callable[[int, int], None] | None = None) -> ReplayResult:
    """Replay run ``run_id`` of ``db``, in two phases, each with its own progress
    (called with ``(done, total)``, first with done = 0 as the phase starts):
    ``pretrain_progress`` while the start is recomputed (only for a run with
    ``init.pretrain_steps``: steps), then ``progress`` while the log is replayed
    (operations)."""
    run, jobs, updates, transfers = operation_log(db, run_id)
    cfg = from_json(run["config_json"])
    try:
        replayable_row(db, run_id)
        # a trace rewritten since would replay another fleet and call it identical
        inputs.check_unchanged(input_pins(db, run_id), cfg, run_id, "replay")
    except (StoreError, ConfigError) as exc:
        raise ReplayError(str(exc)) from None
    if any(j["prev_job"] is None for j in jobs.values()):
        raise ReplayError(f"run {run_id} was recorded by an older fedlm (store schema 2, "
                          f"without worker-state pointers); it cannot be replayed")

    ops: list[tuple[int, str, object]] = []
    for j in jobs.values():
        ops.append((j["dispatch_op"], "dispatch", j))
        if j["status"] == "lost":
            ops.append((j["end_op"], "lost", j))
    ops += [(u["op"], "update", u) for u in updates]
    ops += [(t["op"], "transfer", t) for t in transfers]
    ops += [(t["op"], "timer", t) for t in map(json.loads, event_details(db, run_id,
                                                                         TIMER_EVENT))]
    ops.sort(key=lambda o: o[0])

    if run["initial_hash"] and params_hash(start.initial(cfg)) != run["initial_hash"]:
        raise ReplayError("the initial model differs from the recorded one "
                          "(different torch version or model code?)")
    if pretrain_progress and cfg.init.pretrain_steps:
        pretrain_progress(0, cfg.init.pretrain_steps)
    try:  # init.from and pretraining again, never from the pretraining cache
        params = start.starting_point(cfg, db, use_cache=False,
                                      progress=pretrain_progress).params
    except ConfigError as exc:
        raise ReplayError(f"cannot rebuild the run's start: {exc}") from None
    if run["start_hash"] and params_hash(params) != run["start_hash"]:
        raise ReplayError("the start of the federated phase differs from the recorded one "
                          "(init.from's weights changed, or the pretraining code did)")
    # the server where the run's was: on its device in process (fedlm.runner), else the host
    device = model_lib.resolve_device(cfg.device) if _in_process(db, run_id) else "cpu"
    walk = _Walk(cfg, precision.to_device(params, device),
                 _trainer(cfg, batching.recorded(event_details(db, run_id, batching.KIND)),
                          device),
                 [json.loads(d) for d in event_details(db, run_id, ROUND_DRAWN)])
    held = 1
    if progress:
        progress(0, len(ops))
    for n, (op, kind, row) in enumerate(ops):
        getattr(walk, kind)(row)
        held = max(held, walk.versions_held())
        if progress:
            progress(n + 1, len(ops))
    version, final = walk.server.evaluated()
    return ReplayResult(run_id, run["final_hash"], params_hash(final), version, len(updates),
                        walk.mismatched, held)


class _Walk:
    """The operation log, op by op, through the run's own server calls (``ServerCalls``:
    the order of the server's hooks at each event is the engine's)."""

    def __init__(self, cfg, params, train, draws: list[dict] = ()) -> None:
        self.cfg, self.train, self.mismatched = cfg, train, 0
        self.draws = sorted(draws, key=lambda d: d["op"])  # rounds drawn: from whom, when
        # messages between servers were timed by the run: here only their arrivals count
        self.server = servers.ServerCalls(servers.build(cfg), on_version=lambda version: None)
        self.server.start(params, self.server.links(fleet.node_profiles(cfg)))
        self.sent: dict[int, servers.Sent] = {}  # each job not yet over: what it was sent
        self.states = [MemoryStates() for _ in range(fleet.node_count(cfg))]

    def versions_held(self) -> int:
        """Global versions in memory: the current one and those jobs still to be
        replayed start from."""
        return len({s.job.base_version for s in self.sent.values()}
                   | {self.server.evaluated()[0]})

    def dispatch(self, row) -> None:
        version = self.server.evaluated()[0]
        while self.draws and self.draws[0]["op"] <= row["dispatch_op"]:  # as the run drew
            self.server.offered(self.draws.pop(0)["offered"], version)
        if row["base_version"] != version:
            raise ReplayError(f"job {row['job_id']} starts from version {row['base_version']}, "
                              f"dispatched at version {version} of the replay")
        job = JobSpec(row["job_id"], row["worker"], row["base_version"], row["local_steps"],
                      row["data_seed"], prev_job=row["prev_job"],
                      **{k: row[k] for k in ("shard", "cursor", "schedule_step")
                         if row[k] is not None})  # schema 4 and older: none
        self.sent[job.job_id] = self.server.dispatch(job)  # what the run sent it

    def lost(self, row) -> None:
        self.sent.pop(row["job_id"], None)
        self.server.lost(row["worker"], row["job_id"], row["reason"] or "error")

    def transfer(self, row) -> None:
        staleness = self.server.arrived(row["key"])
        if staleness != row["staleness"]:
            raise ReplayError(f"transfer {row['key']}: staleness {staleness}, "
                              f"log says {row['staleness']}")

    def timer(self, row) -> None:
        self.server.rang(row["key"])

    def update(self, row) -> None:
        """Run the job again, from what it was sent and the worker state it started
        from, and hand its update on as the run did."""
        if row["job_id"] not in self.sent:
            raise ReplayError(f"update {row['seq']} is of job {row['job_id']}, which the "
                              f"log never dispatched")
        sent = self.sent.pop(row["job_id"])
        job = replace(sent.job, local_steps=row["local_steps"], data_seed=row["data_seed"])
        worker_states = self.states[job.worker]
        result, new_state = self.train(sent.payload, worker_states.load(job.prev_job), job)
        worker_states.save(job.job_id, new_state)
        worker_states.prune(job.prev_job)
        grad = compression.decode(result.outer_grad, self.server.reference(job),
                                  link_codecs.network_of(self.cfg.network, job))
        if not same_update(grad, row["update_hash"]):
            self.mismatched += 1

        def check(update, seq: int) -> None:
            if update.staleness != row["staleness"]:
                raise ReplayError(f"update {row['seq']}: staleness {update.staleness}, "
                                  f"log says {row['staleness']}")
        self.server.finished(job, grad, result.tokens, result.steps, record=check)


def _trainer(cfg, batched: bool | None, server_device: str = "cpu"):
    """How replay runs a job: as the run did, batched (``sim.batched``: the run log
    says) or on its own. A batched job computes the same bits alone as in the group
    it ran in (``fedlm.worker.batched``), so replay runs each alone, in log order."""
    def train(params, state: dict, job: JobSpec):
        if batched and batching.batchable(job):
            return batched_updates([(params, state, job)], cfg,
                                   server_device=server_device)[0]
        return job_update(params, state, job, cfg, server_device=server_device)
    return train


def _in_process(db, run_id: int) -> bool:
    from fedlm.runner import IN_PROCESS
    from fedlm.store.readers import worker_nodes

    nodes = worker_nodes(db, run_id)
    return bool(nodes) and nodes[0] == IN_PROCESS


def describe(result: ReplayResult) -> str:
    verdict = "identical" if result.identical else "DIFFERENT"
    lines = [f"run {result.run_id}: replayed {result.updates} updates -> {result.versions} "
             f"versions (at most {result.max_versions_held} held in memory)",
             f"  recorded final weights {result.recorded_hash}",
             f"  replayed final weights {result.replayed_hash}",
             f"  {verdict}"]
    if result.mismatched_updates:
        lines.append(f"  {result.mismatched_updates} updates differed from the log's hashes")
    return "\n".join(lines)

