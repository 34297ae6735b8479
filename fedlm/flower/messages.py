"""The messages between fedlm's ServerApp and ClientApp: one definition of each.

Two exchanges, both Flower ``RecordDict`` contents:

- QUERY: the server asks a node which partition (worker) it holds, and sends the
  run's config so the node can warm its caches; the node answers
  ``partition-id`` and ``num-partitions``.
- TRAIN: the server sends a job (``fedlm.worker.train.JobSpec``), the global params it
  starts from, the run's config (``run_simulation`` gives the nodes an empty run
  config) and the run key that names the node's worker-state files; the node
  answers with the outer gradient and the job's metrics.

``server_app`` writes requests and reads replies, ``client_app`` the reverse; both
only call the functions here, so a field is named in one place.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedlm.job import JobResult, JobSpec


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


# -- tensors: one packed array per message ------------------------------------------
# Flower sends every Array of an ArrayRecord as objects of its own, each with its own
# request on every hop (ServerApp -> SuperLink -> SuperNode -> ClientApp and back):
# per tensor that was ~0.1 s per hop on a busy machine. The tensors travel as one
# byte array (Flower cuts it into 5 MB chunks) with their names, dtypes and shapes
# beside it; the bytes are the tensors' own (native byte order), so nothing is
# rounded or converted.
_PACKED = "fedlm.packed"  # the Array's stype


def pack(tensors) -> ArrayRecord:
    flat = [t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            for t in tensors.values()]
    data = torch.cat(flat).numpy().tobytes() if flat else b""
    layout = [[name, str(t.dtype).removeprefix("torch."), list(t.shape)]
              for name, t in tensors.items()]
    return ArrayRecord({"packed": Array(dtype="uint8", shape=(len(data),), stype=_PACKED,
                                        data=data),
                        "layout": Array(dtype="str", shape=(0,), stype=_PACKED,
                                        data=json.dumps(layout).encode())})


def unpack(record: ArrayRecord) -> "OrderedDict[str, torch.Tensor]":
    base = torch.frombuffer(bytearray(record["packed"].data), dtype=torch.uint8)
    out = OrderedDict()
    offset = 0
    for name, dtype, shape in json.loads(record["layout"].data):
        dt = getattr(torch, dtype)
        n = dt.itemsize * int(torch.Size(shape).numel())
        out[name] = base[offset:offset + n].clone().view(dt).reshape(shape)
        offset += n
    return out


# -- TRAIN: one job and its reply -----------------------------------------------------
@dataclass(frozen=True)
class TrainRequest:
    job: JobSpec
    params: Any  # OrderedDict[str, Tensor]: the global model the job starts from
    cfg_json: str
    run_key: str


def train_request(job: JobSpec, params, cfg_json: str, run_key: str) -> RecordDict:
    return RecordDict({
        "arrays": pack(params),
        "job": ConfigRecord({**job.to_message(), "config": cfg_json, "run-key": run_key}),
    })


def read_train_request(content: RecordDict) -> TrainRequest:
    spec = content["job"]
    return TrainRequest(JobSpec.from_message(spec), unpack(content["arrays"]),
                        str(spec["config"]), str(spec["run-key"]))


def train_reply(reply: JobResult, batch_size: int) -> RecordDict:
    metrics = MetricRecord({"steps": reply.steps, "tokens": reply.tokens,
                            "train-loss": reply.train_loss,
                            "compute-seconds": reply.compute_seconds,
                            "num-examples": reply.steps * batch_size})
    return RecordDict({"arrays": pack(reply.outer_grad), "metrics": metrics,
                       "job": ConfigRecord({"job-id": reply.job_id})})


def read_train_reply(content: RecordDict, job_id: int) -> JobResult:
    m = content["metrics"]
    return JobResult(job_id, unpack(content["arrays"]), int(m["steps"]),
                     int(m["tokens"]), float(m["train-loss"]), float(m["compute-seconds"]))
