"""What a finished job's reply brings the engine: its outer gradient, decoded from what
came over the wire and checked at the boundary, or the reason the job is lost."""

from __future__ import annotations

from typing import Any

from fedlm.engine.types import JobResult
from fedlm.params import BadUpdate, check_update


def outcome(reply: JobResult, reference, network) -> tuple[Any | None, str | None, str]:
    """(the outer gradient, None, "") for a good reply; else (None, the error, the reason
    the job is lost: ``error``, ``deadline``, ``departed`` or ``rejected``).
    ``reference``: the tensors the gradient must be shaped like (the server's)."""
    error = reply.error
    if error is not None:
        for reason in ("deadline", "departed"):
            if error.startswith(reason):
                return None, error, reason
        return None, error, "error"
    try:
        # The one place tensors are unpacked: torch loads with the first update, so the
        # scheduling core imports (and is benchmarked) without it.
        from fedlm.sim import compression

        grad = compression.decode(reply.outer_grad, reference, network)
        check_update(grad, reference)
    except BadUpdate as exc:
        return None, f"rejected update: {exc}", "rejected"
    return grad, None, ""
