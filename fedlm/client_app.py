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

import os
from functools import lru_cache
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedlm.config import Config
from fedlm.data import cache_dir
from fedlm.worker import JobSpec, run_job, warm_up

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
    ask = msg.content["ask"] if "ask" in msg.content else {}
    if "config" in ask:  # warm this process's caches while the run starts up
        warm_up(_config(str(ask["config"])))
    info = ConfigRecord({"partition-id": pid, "num-partitions": n})
    return Message(RecordDict({"info": info}), reply_to=msg)


def _state_file(run_key: str, worker: int) -> Path:
    folder = cache_dir() / "worker-state" / run_key
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"worker{worker}.pt"


def _load_opt_state(context: Context) -> dict:
    """The worker's AdamW state: in ``context.state``, or in a file it points to."""
    if OPT_META not in context.state:
        return {}
    meta = context.state[OPT_META]
    if "file" in meta:
        state = torch.load(str(meta["file"]), weights_only=True)
    else:
        state = dict(context.state[OPT_TENSORS].to_torch_state_dict())
    state["schedule_step"] = int(meta["schedule-step"])
    return state


def _save_opt_state(context: Context, state: dict, cfg: Config, run_key: str,
                    worker: int) -> None:
    tensors = {k: v for k, v in state.items() if k != "schedule_step"}
    meta = {"schedule-step": int(state["schedule_step"])}
    if cfg.inner.state_store == "disk":
        # Thousands of simulated nodes: keep only a path in memory, so memory grows
        # with the jobs in flight, not with the number of workers.
        path = _state_file(run_key, worker)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(tensors, tmp)
        os.replace(tmp, path)
        meta["file"] = str(path)
    else:
        context.state[OPT_TENSORS] = ArrayRecord(torch_state_dict=tensors)
    context.state[OPT_META] = ConfigRecord(meta)


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
    _save_opt_state(context, result.opt_state, cfg, str(spec["run-key"]), job.worker)
    metrics = MetricRecord({"steps": result.steps, "tokens": result.tokens,
                            "train-loss": result.train_loss,
                            "compute-seconds": result.compute_seconds,
                            "num-examples": result.steps * cfg.inner.batch_size})
    grad = {k: v.contiguous() for k, v in result.outer_grad.items()}
    return Message(RecordDict({"arrays": ArrayRecord(torch_state_dict=grad), "metrics": metrics,
                               "job": ConfigRecord({"job-id": job.job_id})}), reply_to=msg)


torch.set_num_threads(1)  # a Ray actor shares the machine with others; jobs set their own
