"""What a finished job's reply brings the engine: its outer gradient, decoded from what
came over the wire and checked at the boundary, or the reason the job is lost."""

from __future__ import annotations

from typing import Any

from fedlm.engine.types import EngineError, JobResult
from fedlm.job import JobSpec
from fedlm.params import BadUpdate, check_update


# How a worker's error reply says its job ran out of memory: Python's MemoryError (and
# torch's CUDA OutOfMemoryError), named first in one process and inside the exception's
# text in a Flower error's reason; torch's CPU allocator when an allocation fails.
OUT_OF_MEMORY = ("MemoryError", "can't allocate memory", "CUDA out of memory")


def out_of_memory(error: str) -> bool:
    """Whether a worker's error reply says its job ran out of memory."""
    return any(sign in error for sign in OUT_OF_MEMORY)


def ran_out_of_memory(job: JobSpec, error: str) -> EngineError:
    """The one line that ends a run whose job ran out of memory: the same job sizes would
    run out again, and a run that drops them (half its compute never applied) is not
    one that finished."""
    return EngineError(f"worker {job.worker}'s job {job.job_id} ({job.local_steps:,} inner "
                       f"steps) ran out of memory ({error.splitlines()[0][:200]}); lower "
                       f"inner.steps or inner.batch_size, bring the fleet's speeds closer, "
                       f"or give the run more memory")


def outcome(reply: JobResult, reference, network) -> tuple[Any | None, str | None, str]:
    """(the outer gradient, None, "") for a good reply; else (None, the error, the reason
    the job is lost: ``error``, ``memory`` (it ran out), ``deadline``, ``departed`` or
    ``rejected``). ``reference``: the tensors the gradient must be shaped like (the
    server's)."""
    error = reply.error
    if error is not None:
        for reason in ("deadline", "departed"):
            if error.startswith(reason):
                return None, error, reason
        return None, error, "memory" if out_of_memory(error) else "error"
    try:
        # The one place tensors are unpacked: torch loads with the first update, so the
        # scheduling core imports (and is benchmarked) without it.
        from fedlm.sim import compression

        grad = compression.decode(reply.outer_grad, reference, network)
        check_update(grad, reference)
    except BadUpdate as exc:
        return None, f"rejected update: {exc}", "rejected"
    return grad, None, ""
