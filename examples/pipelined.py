"""Asynchronous jobs whose transfers run behind the next job's compute, as a fedlm
server kind (a plug-in): a far worker stops waiting for its link.

On a wide-area fleet an asynchronous worker spends much of each job on its link (DN +
DyLU on HALoS's network: goodput 29%, experiments/results/fleets_fair.md). Here a
worker pipelines. The moment a job's compute ends it starts the next job, from the
model it downloaded while it computed, and uploads the finished update meanwhile:

    job k          [================ compute C_k ================]
    behind it      upload of Δ_{k−1} (u), then the model for job k+1 (d)
    exposed        max(0, u + d − C_k): only a link slower than the compute shows

- Job k+1 starts where job k ended, moved as the global model moved meanwhile: the
  model prefetched when job k was dispatched, less job k's own update Δ_k, which is
  still on the wire (the "eager" use of a worker's own outer gradient before the
  global one exists, after Kale et al. 2025). The prefetch starts with job k: fedlm's
  choice, replayable from the order of operations alone; a worker that timed its
  download to end just before it needs the model would start from a newer one.
  ``PipelinedNoCarry`` starts from the prefetched model alone: the ablation.
- Δ_k reaches the server u seconds after job k's compute ends: a message timed over the
  worker's own link (``Message.seconds``, nominal bandwidth and latency). The strategy
  takes it on arrival, so its staleness counts every version made since its job's
  start model was current, transfers included. The run waits for the last updates to
  land (``drains_messages``).
- A worker's first job, and its first after a lost one, downloads the current model
  before it computes, as without the pipeline (its upload is gone with it).

The price is about one more job of staleness per update; the gain, on a link-bound
worker, up to 1 / (1 − its transfer share) times the compute. fedlm's own: the
asynchronous counterpart of the one-step overlap of Kale et al. 2025 (arXiv
2502.12996, synchronous; ``overlap_dc_example.py``). It serves any asynchronous
strategy (delayed Nesterov, ``far_workers:FarDN``, ...) on a star fleet: not
all-reduce topologies, a shared server link or region servers. On the wall clock
(Flower) the jobs are not timed here; the updates still travel as messages.

    PYTHONPATH=examples fedlm run --set server=pipelined:PipelinedServer \\
        --set strategy=delayed-nesterov --set local_steps=dylu-rtt \\
        --set profile=halos --set workers=8
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fedlm.servers import Sent, Server, Serves
from fedlm.sim.fleet import JobTiming, by_region
from fedlm.sim.links import hidden_seconds, transfer_seconds
from fedlm.strategies.base import DROPPED, Update
from fedlm.strategies.transforms import tree_map

SOURCE = ("fedlm's own: the asynchronous counterpart of the one-step overlap of Kale et al. "
          "2025 (arXiv 2502.12996); the prefetch starts with the previous job")


class PipelinedServer(Server):
    """One server whose workers compute the next job while their link moves the last."""

    carry = True  # ... plus its own update still on the wire (False: the model alone)
    # a job starts from its worker's prefetched model; each worker's transfers are timed
    # over its own link; the messages carry workers' updates; a job's update lands on
    # its own (the config refuses a synchronous strategy)
    serves = Serves(keeps_job_starts=True, shared_link=False, drains_messages=True,
                    synchronous=False)
    state_fields = ("prefetched", "piped", "started", "uploading", "own", "pending")

    def start(self, params, fleet: list) -> None:
        super().start(params, fleet)
        self.links = fleet  # the profiles jobs are timed over (worker_links)
        self.region_of = {w: r for r, ws in enumerate(by_region(fleet)) for w in ws}
        self.prefetched: dict[int, tuple[int, Any]] = {}  # worker -> (version, params)
        self.piped: dict[int, bool] = {}  # worker -> its job in flight started prefetched
        self.started: dict[int, int] = {}  # worker -> the version its job started from
        self.uploading: dict[int, float] = {}  # worker -> seconds of the upload it runs
        self.own: dict[int, Any] = {}  # worker -> the outer gradient it is uploading
        self.pending: dict[int, Update] = {}  # key -> an update on its way up

    # -- a job -------------------------------------------------------------------------
    def start_of(self, worker: int):
        version, params = self.prefetched.get(worker, (self.version, self.params))
        self.piped[worker] = worker in self.prefetched
        self.started[worker] = version
        own = self.own.get(worker) if self.carry else None
        if self.piped[worker] and own is not None:  # where its last job ended, moved as
            # the global model moved since that job's start: θ_prefetched − Δ_last
            params = tree_map(lambda p, g: p - g, params, own)
        return params

    def dispatched(self, worker: int, version: int) -> None:
        super().dispatched(worker, version)
        self.prefetched[worker] = (self.version, self.params)  # downloaded behind its compute

    def timing(self, sent: Sent, events, index: int):
        w = sent.job.worker
        whole = events.timing(w, sent.job.local_steps, index)
        if whole is None:  # the wall clock: only the reply says
            return None
        first = not self.piped[w]
        exchange = self.uploading.pop(w, 0.0) + whole.download  # last upload, next model
        hidden = hidden_seconds(exchange, whole.compute)
        return JobTiming(whole.download if first else 0.0, whole.compute, 0.0,
                         exchange=exchange - hidden, before_exchange=whole.compute,
                         hidden=hidden)

    # -- replies -------------------------------------------------------------------------
    def staleness(self, worker: int, base_version: int) -> int:
        return self.version - self.started[worker]

    def accepted(self, worker: int, job) -> None:
        self.seen[worker] = self.started[worker]

    def take(self, update: Update):
        """The update starts up the worker's link; the strategy takes it on arrival."""
        w = update.worker
        link = self.links[w].region
        seconds = transfer_seconds(self.up_bytes, link.up_bw, link.latency)
        self.uploading[w] = seconds
        self.own[w] = update.outer_grad
        key = self.queue(self.region_of[w], None, self.up_bytes, "push", seconds)
        self.pending[key] = replace(update, base_version=self.started.pop(w))
        return None

    def lose(self, worker: int, *, job_id: int, reason: str):
        self.prefetched.pop(worker, None)  # its next job downloads before it computes
        self.own.pop(worker, None)
        self.started.pop(worker, None)
        return super().lose(worker, job_id=job_id, reason=reason)

    # -- messages ----------------------------------------------------------------------
    def deliver(self, key: int) -> tuple[Any | None, int]:
        update = self.pending.pop(key)
        staleness = self.version - update.base_version
        new = self.strategy.on_update(replace(update, staleness=staleness), self.params)
        return (None if new is DROPPED else new), staleness

    def describe(self) -> str:
        return "pipelined: transfers behind the next job's compute"


class PipelinedNoCarry(PipelinedServer):
    """The ablation: each job starts from the prefetched model alone, without its
    worker's own last update (every update then counts its worker's last one again)."""

    carry = False
