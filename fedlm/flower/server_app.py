"""fedlm's Flower ServerApp: the engine driving Flower's Grid.

Jobs travel as Flower messages: ``push_messages`` sends one TRAIN message per
job (at most one in flight per worker), ``pull_messages`` collects whatever
replies are ready, matched back to jobs by ``reply_to_message_id`` since they
come in any order. Error replies (expired TTL, unreachable node, crashed
ClientApp) become failed jobs, not crashes.

``app`` is what ``flwr run .`` loads (config from the run config);
``make_server_app`` is what ``fedlm run`` uses (config handed in directly,
since ``run_simulation`` passes an empty run config).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Callable

from flwr.app import Context, Message, MessageType
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from fedlm import config_load
from fedlm.sim import fleet
from fedlm.flower import messages, patches
from fedlm.config import Config
from fedlm.engine import EngineError, Interrupted, Progress, JobResult
from fedlm.runner import execute
from fedlm.job import JobSpec

log = logging.getLogger("fedlm")

NODE_WAIT_SECONDS = 180.0  # how long to wait for all SuperNodes to register
POLL_SECONDS = 0.05  # pause between empty pulls (Flower itself polls at 0.1 s)
PULLS_PER_SECOND = 20.0  # deployment: pull requests per second, all pending messages together


class FlowerTransport:
    """The engine's transport over a Flower ``Grid``."""

    def __init__(self, grid: Grid, cfg: Config, run_key: str,
                 should_stop: Callable[[], bool] = lambda: False,
                 allowed: set[int] | None = None) -> None:
        self.grid = grid
        # the node ids this run may use (a deployment's own SuperNodes); None: any
        self.allowed = allowed
        self._ignored: set[int] = set()  # strangers already named in the log
        self.should_stop = should_stop  # asked while connect waits: it can take long
        self.cfg = cfg
        self.cfg_json = cfg.to_json()
        self.run_key = run_key  # names this run's worker-state files on the nodes
        self.node_of: dict[int, int] = {}  # worker (partition id) -> Flower node id
        self.pending: dict[str, int] = {}  # message id -> job id
        # Deployment: every pending message is pulled by a thread of its own. A
        # reply whose SuperNode died while uploading it blocks Grid.pull_messages
        # until Flower gives up on its objects (OBJECT_PUSH_SESSION_TTL_SECONDS,
        # 180 s in 1.41 and 1.42); pulled together with the others, it would hold every
        # other reply back that long. (Simulation: one pull for all, no threads.)
        self.per_message = not isinstance(grid, InMemoryGrid)
        self._pulled: queue.SimpleQueue = queue.SimpleQueue()  # Messages or exceptions
        self._pullers: set[str] = set()  # message ids with a puller thread

    def connect(self) -> dict[int, int]:
        """Wait for the SuperNodes and learn which node holds which partition."""
        deadline = time.monotonic() + NODE_WAIT_SECONDS
        want = fleet.node_count(self.cfg)
        while True:
            nodes = self._own(sorted(self.grid.get_node_ids()))
            if len(nodes) >= want:
                break
            if time.monotonic() > deadline:
                raise EngineError(f"workers: expected {want} SuperNodes, only {len(nodes)} "
                                  f"registered within {NODE_WAIT_SECONDS:.0f} s")
            self._stop_if_asked()
            time.sleep(0.5)
        msgs = [Message(messages.partition_query(self.cfg_json), dst_node_id=n, message_type=MessageType.QUERY, ttl=self.cfg.sim.ttl)
                for n in nodes]
        replies = self._send_and_receive(msgs, deadline=time.monotonic() + NODE_WAIT_SECONDS)
        if len(replies) < len(msgs):  # a machine too loaded to answer in time, say so
            raise EngineError(f"workers: {len(msgs) - len(replies)} of {len(msgs)} nodes did "
                              f"not answer the partition query within "
                              f"{NODE_WAIT_SECONDS:.0f} s")
        for reply in replies:
            if reply.has_error():
                raise EngineError(f"node {reply.metadata.src_node_id} did not answer the "
                                  f"partition query: {reply.error.reason}")
            pid, n = messages.read_partition_answer(reply.content)
            if n != want:
                raise EngineError(f"workers: config asks for {want}, but nodes were started "
                                  f"with num-partitions={n}")
            self.node_of[pid] = reply.metadata.src_node_id
        missing = sorted(set(range(want)) - set(self.node_of))
        if missing:
            raise EngineError(f"workers: no node holds partition(s) {missing}")
        return dict(self.node_of)

    def _own(self, nodes: list[int]) -> list[int]:
        """``nodes`` less the ones this run was not told about, each named once in the log:
        a SuperNode registered by someone else is admitted by the SuperLink, not by fedlm."""
        if self.allowed is None:
            return nodes
        for n in sorted(set(nodes) - self.allowed - self._ignored):
            self._ignored.add(n)
            log.warning("fedlm: ignoring SuperNode %d: not one of this deployment's "
                        "(registered by someone else); it gets no message", n)
        return [n for n in nodes if n in self.allowed]

    def _stop_if_asked(self) -> None:
        if self.should_stop():
            raise Interrupted("interrupted before the first job")

    def _send_and_receive(self, msgs: list[Message], deadline: float) -> list[Message]:
        """``Grid.send_and_receive``, asking ``should_stop`` at every pull: with thousands
        of nodes Flower takes minutes over one message each, and a stop must not wait."""
        waiting = set(self.grid.push_messages(msgs))
        replies: list[Message] = []
        while waiting and time.monotonic() < deadline:
            if self.should_stop():
                self._drop(waiting)
                raise Interrupted("interrupted before the first job")
            for reply in self.grid.pull_messages(list(waiting)):
                waiting.discard(reply.metadata.reply_to_message_id)
                replies.append(reply)
            if waiting:
                time.sleep(POLL_SECONDS)
        return replies

    def _drop(self, message_ids) -> None:
        """Forget messages whose replies will not be waited for (simulation only).
        Flower's simulation hands messages out in sweeps over every node and every
        stored message, and asks whether to stop only between sweeps: with thousands
        left behind one sweep takes minutes, and so would the stop. The few a node
        is working on now still reply, find no message, and Flower logs an error
        for each: expected once the run has ended, so its log is quieted."""
        state = getattr(self.grid, "state", None) if isinstance(self.grid, InMemoryGrid) else None
        if state is None or not message_ids:
            return
        logging.getLogger("flwr").setLevel(logging.CRITICAL)
        state.delete_messages(message_ins_ids=set(message_ids))

    def close(self) -> None:
        """The run has ended: the jobs still in flight are dropped (``_drop``)."""
        self._drop(self.pending)
        self.pending.clear()

    def submit(self, job: JobSpec, params) -> None:
        msg = Message(messages.train_request(job, params, self.cfg_json, self.run_key),
                      dst_node_id=self.node_of[job.worker],
                      message_type=MessageType.TRAIN, ttl=self.cfg.sim.ttl,
                      group_id=str(job.base_version))
        (msg_id,) = list(self.grid.push_messages([msg]))
        self.pending[msg_id] = job.job_id

    def collect(self, timeout: float) -> list[JobResult]:
        if self.per_message:
            return self._collect_per_message(timeout)
        deadline = time.monotonic() + timeout
        while True:
            out = []
            if self.pending:
                for reply in self.grid.pull_messages(list(self.pending)):
                    job_id = self.pending.pop(reply.metadata.reply_to_message_id, None)
                    if job_id is not None:
                        out.append(self._to_reply(job_id, reply))
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(POLL_SECONDS)

    def _collect_per_message(self, timeout: float) -> list[JobResult]:
        self._pullers &= self.pending.keys()  # one puller per message, ever
        for msg_id in list(self.pending):
            if msg_id not in self._pullers:
                self._pullers.add(msg_id)
                threading.Thread(target=self._pull, args=(msg_id,), daemon=True,
                                 name=f"fedlm-pull-{msg_id[:8]}").start()
        out = []
        try:
            item = self._pulled.get(timeout=max(timeout, 0.0))
            while True:
                if isinstance(item, BaseException):
                    raise item
                job_id = self.pending.pop(item.metadata.reply_to_message_id, None)
                if job_id is not None:
                    out.append(self._to_reply(job_id, item))
                item = self._pulled.get_nowait()
        except queue.Empty:
            return out

    def _pull(self, msg_id: str) -> None:
        """Pull one message's reply until it is there (a puller thread)."""
        try:
            while msg_id in self.pending:
                replies = list(self.grid.pull_messages([msg_id]))
                if replies:
                    for reply in replies:
                        self._pulled.put(reply)
                    return
                time.sleep(max(POLL_SECONDS, len(self.pending) / PULLS_PER_SECOND))
        except BaseException as exc:  # handed to the engine's thread, raised there
            self._pulled.put(exc)

    @staticmethod
    def _to_reply(job_id: int, reply: Message) -> JobResult:
        now = time.time()
        if reply.has_error():
            return JobResult.failed(job_id, f"flower error {reply.error.code}: "
                                    f"{reply.error.reason}", now)
        return messages.read_train_reply(reply.content, job_id).arrived(now)


def run_on_grid(grid: Grid, cfg: Config, db_path: str,
                progress: Callable[[Progress], None] | None = None,
                on_start: Callable[[int], None] | None = None,
                should_stop: Callable[[], bool] | None = None, resume: int | None = None,
                pretrain_progress: Callable[[int, int], None] | None = None,
                allowed: set[int] | None = None, server=None) -> int:
    """Run ``cfg`` (or continue run ``resume``) on ``grid``'s nodes (only those of
    ``allowed``, if given); everything lands in the run store. Returns the run id.
    ``server``: the run's server kind, built already (else built for the run)."""
    def connect(run_key: str):
        transport = FlowerTransport(grid, cfg, run_key, should_stop or (lambda: False),
                                    allowed)
        return transport, transport.connect()

    return execute(cfg, db_path, connect, progress, on_start, should_stop, resume=resume,
                   pretrain_progress=pretrain_progress, server=server)


def make_server_app(cfg: Config, db_path: str,
                    progress: Callable[[Progress], None] | None = None,
                    on_start: Callable[[int], None] | None = None,
                    should_stop: Callable[[], bool] | None = None,
                    resume: int | None = None,
                    pretrain_progress: Callable[[int, int], None] | None = None,
                    server=None) -> ServerApp:
    """A ServerApp bound to ``cfg`` (for ``run_simulation``, whose run config is empty);
    ``server``: the run's server kind, built already in this process."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_on_grid(grid, cfg, db_path, progress, on_start, should_stop, resume,
                    pretrain_progress, server=server)

    return app


# -- for `flwr run .`: config from [tool.flwr.app.config] / --run-config -------------
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    if not isinstance(grid, InMemoryGrid):  # deployment: this process is the ServerApp's own
        # a reply's objects lag its announcement: pull them again after 20 ms, not 1 s
        log.warning("%s", patches.pull_backoff("flwr.superlink.grid.http_grid").describe())
    rc = context.run_config
    path = str(rc.get("config", "")) or None
    overrides = [s for s in str(rc.get("set", "")).split() if s]
    cfg = config_load.load(path, overrides)
    db = str(rc.get("db", "")) or cfg.db

    def log_progress(p: Progress) -> None:
        ppl = f"{p.perplexity:.2f}" if p.perplexity is not None else "-"
        log.warning("fedlm: version %d/%d, %s %.1f s, perplexity %s", p.version, p.target,
                    "virtual time" if cfg.clock == "virtual" else "wall clock",
                    p.virtual_time, ppl)

    report = str(rc.get("run-id-file", ""))

    def stored(run_id: int) -> None:  # who started `flwr run` learns which run is its own
        if report:
            tmp = Path(f"{report}.tmp")
            tmp.write_text(f"{run_id}\n")
            os.replace(tmp, report)

    # a deployment names its own SuperNodes (fedlm.deploy.local: the ids it registered)
    nodes = str(rc.get("nodes", "")).split()
    allowed = {int(n) for n in nodes} if nodes else None
    run_id = run_on_grid(grid, cfg, db, log_progress, on_start=stored, allowed=allowed)
    log.warning("fedlm: run %d stored in %s", run_id, db)
