"""fedlm's Flower ClientApp: one worker running jobs.

``query``  answers which partition (worker index) this node holds.
``train``  runs one job (``fedlm.worker.run_job``) on the global params it was
           sent and replies with the outer gradient and metrics.

The worker's AdamW state is kept in ``context.state``, which Flower persists per
node across messages (in simulation as in deployment), and is never sent. The
run config travels inside each job message, so the same app works under
``fedlm run`` (whose run config is empty) and ``flwr run``.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedlm.config import Config
from fedlm.worker import JobSpec, run_job

OPT_TENSORS = "fedlm.inner-optimizer"  # context.state key: AdamW moments (ArrayRecord)
OPT_META = "fedlm.inner-meta"  # context.state key: schedule position (ConfigRecord)

app = ClientApp()


@lru_cache(maxsize=4)
def _config(text: str) -> Config:
    return Config.from_json(text)


def _partition(context: Context) -> tuple[int, int]:
    return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])


@app.query()
def query(msg: Message, context: Context) -> Message:
    pid, n = _partition(context)
    info = ConfigRecord({"partition-id": pid, "num-partitions": n})
    return Message(RecordDict({"info": info}), reply_to=msg)


def _load_opt_state(context: Context) -> dict:
    state: dict = {}
    if OPT_TENSORS in context.state:
        state.update(context.state[OPT_TENSORS].to_torch_state_dict())
        state["schedule_step"] = int(context.state[OPT_META]["schedule-step"])
    return state


def _save_opt_state(context: Context, state: dict) -> None:
    tensors = {k: v for k, v in state.items() if k != "schedule_step"}
    context.state[OPT_TENSORS] = ArrayRecord(torch_state_dict=tensors)
    context.state[OPT_META] = ConfigRecord({"schedule-step": int(state["schedule_step"])})


@app.train()
def train(msg: Message, context: Context) -> Message:
    spec = msg.content["job"]
    cfg = _config(str(spec["config"]))
    job = JobSpec(job_id=int(spec["job-id"]), worker=int(spec["worker"]),
                  base_version=int(spec["base-version"]), local_steps=int(spec["local-steps"]),
                  data_seed=int(spec["data-seed"]))
    pid, _ = _partition(context)
    if job.worker != pid:
        raise ValueError(f"job {job.job_id} is for worker {job.worker}, this node holds {pid}")
    params = msg.content["arrays"].to_torch_state_dict()
    result = run_job(params, _load_opt_state(context), job, cfg)
    _save_opt_state(context, result.opt_state)
    metrics = MetricRecord({"steps": result.steps, "tokens": result.tokens,
                            "train-loss": result.train_loss,
                            "compute-seconds": result.compute_seconds,
                            "num-examples": result.steps * cfg.inner.batch_size})
    grad = {k: v.contiguous() for k, v in result.outer_grad.items()}
    return Message(RecordDict({"arrays": ArrayRecord(torch_state_dict=grad), "metrics": metrics,
                               "job": ConfigRecord({"job-id": job.job_id})}), reply_to=msg)


torch.set_num_threads(1)  # a Ray actor shares the machine with others; jobs set their own
