"""What a job is, in the words every layer shares: the server's request
(``JobSpec``), the marker of a fresh optimizer state (``FRESH``) and a job's
result as it comes back (``JobResult``).

The engine, the run log, the messages, the in-process transport and both
Flower apps speak this vocabulary; the worker (``fedlm.worker``, torch) fills
it in. Standard library only, so the engine imports without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

FRESH = -1  # prev_job of a worker's first job: start from a new optimizer


@dataclass(frozen=True)
class JobSpec:
    """What the server asks of one job (sent in the message's config)."""

    job_id: int
    worker: int
    base_version: int
    local_steps: int
    data_seed: int
    prev_job: int = FRESH  # the job whose optimizer state to start from
    keep_from: int = -1  # the worker may delete its states of older jobs
    fault: str = ""  # injected fault to act out (fedlm.sim.faults); "" = none
    shard: int = -1  # data shard it trains (data.shard_choice = paper); -1: the worker's own
    cursor: int = 0  # inner steps handed out from that shard before this job
    schedule_step: int = -1  # inner-schedule position of its first step; -1: the worker's own
    # Streaming DiLoCo (fedlm.strategies.fragments): the fragment whose outer gradient it
    # reports (-1: the whole model, not streaming) and the inner step at which it mixes in
    # the global fragments it was sent (-1: none sent)
    fragment: int = -1
    mix_step: int = -1
    # its upload's encoding where its link is slow (fedlm.sim.link_codecs); "": the run's
    compression: str = ""

    def to_message(self) -> dict[str, int | str]:
        """The job as the flat config a Flower message carries (``from_message`` reads it)."""
        return {name.replace("_", "-"): getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_message(cls, spec) -> "JobSpec":
        kwargs = {}
        for name, f in cls.__dataclass_fields__.items():
            key = name.replace("_", "-")
            if key in spec:
                kwargs[name] = str(spec[key]) if f.type == "str" else int(spec[key])
        return cls(**kwargs)


@dataclass(frozen=True)
class JobResult:
    """A job's result: its outer gradient (θ_start − θ_end, as encoded for the wire)
    and what it did, or the error that ended it. The worker makes it, a transport
    carries it (stamping ``wall_arrival``), the engine hands it on."""

    job_id: int
    outer_grad: object | None  # OrderedDict[str, Tensor]; None on error
    steps: int = 0
    tokens: int = 0
    train_loss: float = float("nan")  # mean training loss over the job's steps
    compute_seconds: float = 0.0  # real seconds the inner loop took
    error: str | None = None
    wall_arrival: float = 0.0  # when it reached the server (time.time())

    @classmethod
    def failed(cls, job_id: int, error: str, wall_arrival: float = 0.0) -> "JobResult":
        return cls(job_id, None, error=error, wall_arrival=wall_arrival)

    def arrived(self, when: float) -> "JobResult":
        """This result as it reached the server at ``when``."""
        return replace(self, wall_arrival=when)
