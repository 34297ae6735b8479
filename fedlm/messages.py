"""The messages between fedlm's ServerApp and ClientApp: one definition of each.

Two exchanges, both Flower ``RecordDict`` contents:

- QUERY: the server asks a node which partition (worker) it holds, and sends the
  run's config so the node can warm its caches; the node answers
  ``partition-id`` and ``num-partitions``.
- TRAIN: the server sends a job (``fedlm.worker.JobSpec``), the global params it
  starts from, the run's config (``run_simulation`` gives the nodes an empty run
  config) and the run key that names the node's worker-state files; the node
  answers with the outer gradient and the job's metrics.

``server_app`` writes requests and reads replies, ``client_app`` the reverse; both
only call the functions here, so a field is named in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedlm.worker import JobSpec


# -- QUERY: which partition does a node hold ----------------------------------------
def partition_query(cfg_json: str) -> RecordDict:
    return RecordDict({"ask": ConfigRecord({"what": "partition-id", "config": cfg_json})})


def query_config(content: RecordDict) -> str | None:
    """The run config a partition query carries (None: an older or bare query)."""
    ask = content["ask"] if "ask" in content else {}
    return str(ask["config"]) if "config" in ask else None


def partition_answer(partition_id: int, num_partitions: int) -> RecordDict:
    return RecordDict({"info": ConfigRecord({"partition-id": partition_id,
                                             "num-partitions": num_partitions})})


def read_partition_answer(content: RecordDict) -> tuple[int, int]:
    info = content["info"]
    return int(info["partition-id"]), int(info["num-partitions"])


# -- TRAIN: one job and its reply -----------------------------------------------------
@dataclass(frozen=True)
class TrainRequest:
    job: JobSpec
    params: Any  # OrderedDict[str, Tensor]: the global model the job starts from
    cfg_json: str
    run_key: str


def train_request(job: JobSpec, params, cfg_json: str, run_key: str) -> RecordDict:
    return RecordDict({
        "arrays": ArrayRecord(torch_state_dict=params),
        "job": ConfigRecord({**job.to_message(), "config": cfg_json, "run-key": run_key}),
    })


def read_train_request(content: RecordDict) -> TrainRequest:
    spec = content["job"]
    return TrainRequest(JobSpec.from_message(spec), content["arrays"].to_torch_state_dict(),
                        str(spec["config"]), str(spec["run-key"]))


@dataclass(frozen=True)
class TrainReply:
    job_id: int
    outer_grad: Any  # OrderedDict[str, Tensor]: θ_start − θ_end
    steps: int
    tokens: int
    train_loss: float
    compute_seconds: float


def train_reply(reply: TrainReply, batch_size: int) -> RecordDict:
    metrics = MetricRecord({"steps": reply.steps, "tokens": reply.tokens,
                            "train-loss": reply.train_loss,
                            "compute-seconds": reply.compute_seconds,
                            "num-examples": reply.steps * batch_size})
    grad = {k: v.contiguous() for k, v in reply.outer_grad.items()}
    return RecordDict({"arrays": ArrayRecord(torch_state_dict=grad), "metrics": metrics,
                       "job": ConfigRecord({"job-id": reply.job_id})})


def read_train_reply(content: RecordDict, job_id: int) -> TrainReply:
    m = content["metrics"]
    return TrainReply(job_id, content["arrays"].to_torch_state_dict(), int(m["steps"]),
                      int(m["tokens"]), float(m["train-loss"]), float(m["compute-seconds"]))
