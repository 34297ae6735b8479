"""How long one exchange of outer gradients takes, per collective topology:
the formulas the simulator (``fedlm.sim.fleet.JobTimer``) and the planner
(``fedlm.plan``) share. Torch-free, plain floats.

``network.topology`` picks one:

- ``star``: a parameter server. Each site uploads its (encoded) outer
  gradient to the server and downloads the new model: a site moves
  ``up + down`` bytes, the server ``n`` times that. Timed per transfer by the
  site's own links (and, when limited, the server's shared link:
  ``fedlm.sim.network``), not here.
- ``ring``: a ring all-reduce among the ``n`` sites, no server. A
  reduce-scatter and an all-gather of ``n − 1`` steps each; in every step
  each site sends ``nbytes / n`` to its successor and receives as much from
  its predecessor, all at once, so a step lasts as long as its slowest link
  (``bytes / n`` over the smallest of the sites' up and down bandwidths) plus
  one hop's latency::

      seconds = 2(n − 1) · (nbytes / (n · bw_min) + latency)

  A site sends (and receives) ``2(n − 1)/n · nbytes`` — about twice the
  payload, whatever ``n``.
- ``tree``: a reduce up a binary tree and a broadcast down it, ``d =
  ceil(log2 n)`` levels each, every level moving the whole payload over the
  slowest link::

      seconds = 2d · (nbytes / bw_min + latency)

  An inner site receives from two children and sends to its parent on the
  way up, and the reverse on the way down: at most ``3 · nbytes`` each way.
- ``hierarchical``: a data centre's workers train as one data-parallel pod
  (a ring all-reduce of the model every inner step over the fast link inside
  the data centre: ``intra_step``), and the pods talk to the server as in
  ``star`` (``network.hierarchical``).

The latency of a hop is the one-way latency of the sites it joins (a site's
``latency``: the larger of the two). Compressed payloads stay compressed at
every hop (a quantised all-reduce re-encodes what it forwards, as torchft's
does), so ``nbytes`` is the encoded size.
"""

from __future__ import annotations

import math

TOPOLOGIES = ("star", "ring", "tree", "hierarchical")
ALLREDUCE = ("ring", "tree")  # no server: every site applies the outer step itself


def ring_seconds(nbytes: float, n: int, bw_min: float, latency: float) -> float:
    """A ring all-reduce of ``nbytes`` among ``n`` sites (0 for a single site)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * (nbytes / (n * bw_min) + latency)


def allreduce_bound_seconds(nbytes: float, n: float, bw: float, latency: float) -> float:
    """The bandwidth-optimal all-reduce of ``nbytes`` among ``n`` nodes, the lower
    bound Charles et al. 2025 (appendix A.2) time theirs by::

        seconds = 2 · nbytes / bw · (1 − 1/n) + latency

    Its first term is ``ring_seconds``' bandwidth term (2(n − 1) steps of
    ``nbytes / n``); the latency is charged once per all-reduce (the paper's ε),
    where the simulator's ring pays a hop's latency at each of its 2(n − 1) steps.
    With ``latency`` 0 the two agree. ``n`` may be fractional (a planner's chip
    count); at ``n`` = 1 only the latency is left, as in the paper's formula.
    """
    return 2 * nbytes / bw * (1 - 1 / n) + latency


def ring_bytes_per_site(nbytes: float, n: int) -> float:
    """What each site sends (and receives) in a ring all-reduce."""
    return 2 * (n - 1) / n * nbytes if n > 1 else 0.0


def tree_depth(n: int) -> int:
    """Levels of a binary tree over ``n`` sites."""
    return math.ceil(math.log2(n)) if n > 1 else 0


def tree_seconds(nbytes: float, n: int, bw_min: float, latency: float) -> float:
    """A binary-tree reduce and broadcast of ``nbytes`` among ``n`` sites."""
    return 2 * tree_depth(n) * (nbytes / bw_min + latency)


def tree_bytes_per_site(nbytes: float, n: int) -> float:
    """What the busiest site (an inner node: two children) sends in a tree
    all-reduce: its reduced payload up, the result to two children down."""
    if n <= 1:
        return 0.0
    return 3 * nbytes if n > 2 else 2 * nbytes


def allreduce_seconds(topology: str, nbytes: float, n: int, bw_min: float,
                      latency: float) -> float:
    """The exchange of a server-less topology (``ring`` or ``tree``)."""
    if topology == "ring":
        return ring_seconds(nbytes, n, bw_min, latency)
    if topology == "tree":
        return tree_seconds(nbytes, n, bw_min, latency)
    raise ValueError(f"{topology!r} is not an all-reduce topology (ring, tree)")


def intra_step(model_bytes: float, members: int, intra_bw: float) -> float:
    """Seconds per inner step a pod of ``members`` workers spends all-reducing its
    gradients (ring, over the data centre's own link; latency neglected)."""
    if members <= 1:
        return 0.0
    return 2 * (members - 1) / members * model_bytes / intra_bw
