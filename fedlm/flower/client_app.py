"""fedlm's Flower ClientApp: one worker running jobs.

``query``  answers which partition (worker index) this node holds.
``train``  runs one job (``fedlm.worker.train.run_job``) on the global params it was
           sent and replies with the outer gradient and metrics.

The worker's AdamW states are kept in ``context.state``, which Flower persists
per node across messages (in simulation as in deployment; in the warm executor
of ``fedlm deploy local`` the executor holds it, ``fedlm.deploy.warm_executor``),
or in node-local files; each job names the state it starts from
(``fedlm.worker.states``). This is the ``clientapp`` of ``pyproject.toml``: the
simulation engine, ``flwr run .`` and a deployment all run it.
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
from fedlm.flower import messages
from fedlm.config_load import from_json
from fedlm.worker.train import serve_job, warm_up
from fedlm.worker.states import worker_states

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


def train_answer(content: RecordDict, node_config: Mapping, state: RecordDict) -> RecordDict:
    """Run the job ``content`` asks for; ``state`` is the node's state RecordDict
    (``context.state``, or the same kept by a node's worker process)."""
    request = messages.read_train_request(content)
    cfg = _config(request.cfg_json)
    job = request.job
    pid = int(node_config["partition-id"])
    if job.worker != pid:
        raise ValueError(f"job {job.job_id} is for worker {job.worker}, this node holds {pid}")
    step_time = node_config.get("step-time")
    states = worker_states(cfg, request.run_key, job.worker, context_state=state)
    result = serve_job(request.params, states, job, cfg,
                       step_time=float(step_time) if step_time is not None else None)
    return messages.train_reply(result, cfg.inner.batch_size)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return Message(train_answer(msg.content, context.node_config, context.state),
                   reply_to=msg)


torch.set_num_threads(1)  # a Ray actor shares the machine with others; jobs set their own
