"""How long a link takes: the one rule that the simulator (each job's transfers,
``fedlm.sim.fleet``, ``fedlm.engine.events``), messages between servers
(``fedlm.engine.transfers``) and the planner (``fedlm.plan``) share.

    seconds = latency + bytes / bandwidth       bytes/s: the link's, scaled by the
                                                daily cycle, or the fair share a
                                                shared link gives (``fedlm.sim.network``
                                                in the simulator, ``fedlm.plan.fluid``'s
                                                expectation in the planner)
    hidden  = min(exchange, ahead)              an exchange running behind ``ahead``
                                                seconds of compute hides that much of
                                                itself; the rest is exposed

Collectives (a ring or tree all-reduce, pods) are ``fedlm.sim.collectives``, also
shared by both. Works on floats and on numpy arrays alike.
"""

from __future__ import annotations

import numpy as np

GBIT = 1e9 / 8  # bytes/s in one Gbit/s: links are quoted in bits, timed in bytes


def transfer_seconds(nbytes, bandwidth, latency):
    """Seconds to move ``nbytes`` over a link of ``bandwidth`` bytes/s and ``latency`` s."""
    return latency + nbytes / bandwidth


def hidden_seconds(exchange, ahead):
    """How much of an ``exchange`` (seconds) hides behind ``ahead`` seconds of compute."""
    if isinstance(exchange, np.ndarray) or isinstance(ahead, np.ndarray):
        return np.minimum(exchange, ahead)
    return min(exchange, ahead)
