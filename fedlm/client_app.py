"""fedlm's Flower ClientApp: one worker running jobs.

``query``  answers which partition (worker index) this node holds.
``train``  runs one job (``fedlm.worker.run_job``) on the global params it was
           sent and replies with the outer gradient and metrics.

The worker's AdamW states are kept in ``context.state``, which Flower persists
per node across messages (in simulation as in deployment), or in node-local
files; each job names the state it starts from (``fedlm.worker_state``).
They are never sent. The run config travels inside each job message, so the
same app works under ``fedlm run`` (whose run config is empty) and
``flwr run``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedlm.config import Config
from fedlm import messages
from fedlm.config_load import from_json
from fedlm.worker import serve_job, warm_up
from fedlm.worker_state import ContextStates, DiskStates, disk_folder

app = ClientApp()


@lru_cache(maxsize=4)
def _config(text: str) -> Config:
    return from_json(text)


def query_answer(content: RecordDict, node_config: Mapping) -> RecordDict:
    """The answer to a partition query (warms this process's caches on the way)."""
    cfg_json = messages.query_config(content)
    if cfg_json is not None:  # warm this process's caches while the run starts up
        warm_up(_config(cfg_json))
    return messages.partition_answer(int(node_config["partition-id"]),
                                     int(node_config["num-partitions"]))


@app.query()
def query(msg: Message, context: Context) -> Message:
    return Message(query_answer(msg.content, context.node_config), reply_to=msg)


def _states(state: RecordDict, cfg: Config, run_key: str, worker: int):
    """This worker's optimizer-state store (see fedlm.worker_state)."""
    if cfg.state_store() == "disk":
        # Node-local files: survive a crashed process (resume needs them), and keep
        # memory flat with thousands of simulated nodes.
        return DiskStates(disk_folder(run_key, worker))
    return ContextStates(state)


def train_answer(content: RecordDict, node_config: Mapping, state: RecordDict) -> RecordDict:
    """Run the job ``content`` asks for; ``state`` is the node's state RecordDict
    (``context.state``, or the same kept by a node's worker process)."""
    request = messages.read_train_request(content)
    cfg, job = _config(request.cfg_json), request.job
    pid = int(node_config["partition-id"])
    if job.worker != pid:
        raise ValueError(f"job {job.job_id} is for worker {job.worker}, this node holds {pid}")
    step_time = node_config.get("step-time")
    result = serve_job(request.params, _states(state, cfg, request.run_key, job.worker), job,
                       cfg, step_time=float(step_time) if step_time is not None else None)
    reply = messages.TrainReply(job.job_id, result.outer_grad, result.steps, result.tokens,
                                result.train_loss, result.compute_seconds)
    return messages.train_reply(reply, cfg.inner.batch_size)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return Message(train_answer(msg.content, context.node_config, context.state),
                   reply_to=msg)


torch.set_num_threads(1)  # a Ray actor shares the machine with others; jobs set their own
