"""The idealized wall-clock model of Charles et al. 2025, appendix A.

"Communication-Efficient Language Model Training Scales Reliably and
Robustly: Scaling Laws for DiLoCo", arXiv 2503.09799, appendix A (A.1 compute,
A.2 communication, A.3 total). Its symbols:

    N params, D tokens, B global batch (tokens), T = D / B steps,
    R chips of Q FLOP/s each, M DiLoCo replicas (one per data centre), H,
    W0, ε0 inside a data centre; W1, ε1 between data centres.

    compute       = 6 N D / (R Q)                                   (A.1)
    all-reduce    = 2 N / W · (1 − 1/n) + ε      over n nodes        (A.2, the
                                                   bandwidth-optimal lower bound;
                                                   N here in bytes: Units below)
    Data-Parallel : T · (2N/W1 · (1 − 1/R) + ε1)
    DiLoCo, M = 1 : T · (1 + 1/H) · (2N/W1 · (1 − 1/R) + ε1)
    DiLoCo, M ≥ 2 : T · (2N/W0 · (1 − M/R) + ε0) + T/H · (2N/W1 · (1 − 1/R) + ε1)
    total         = compute + communication                         (A.3)

and compute utilisation = compute / total. The paper's defaults (A.3): Q =
300 TFLOP/s; networks of 400 Gbit/s and 1e-4 s (high: always inside a data
centre), 100 Gbit/s and 1e-3 s (medium), 10 Gbit/s and 1e-2 s (low).

Every all-reduce here is ``fedlm.sim.collectives.allreduce_bound_seconds``, the
home of the simulator's collectives: it is the simulator's ring
(``ring_seconds``) with the latency ε charged once per all-reduce instead of
at each of the ring's 2(n − 1) hops, which is A.2's formula, so this model
reproduces the paper's numbers rather than the simulator's ring.

What the appendix leaves open, and how it is read here (each says so where used):

- **Units.** Bytes and bytes/s, as everywhere in fedlm (``fedlm.sim.links``,
  ``fedlm.plan``); the paper's networks are quoted in Gbit/s and kept so in
  ``NETWORKS``' comments and the command line's flags and table. 2N/W divides
  parameters by a bandwidth; the paper trains in bfloat16 ("bfloat16
  representation of model weights and gradients throughout"), so a parameter
  is ``bytes_per_param`` = 2 bytes on the wire by default (1/8 is the formula
  taken literally, a parameter per bit).
- **Streaming** (P fragments): the appendix says the cost "applies to the
  Streaming DiLoCo as well" — the same bytes, a fragment of N/P every H/P
  steps. Here each fragment's all-reduce also pays its own latency ε1
  (P of them per H steps; with P = 1 it is the formula above).
- **Overlap** (τ inner steps): the appendix says the communication term may be
  omitted "if computation time dominates communication time", without a
  formula. Here a fragment's all-reduce is hidden behind up to τ inner steps:
  exposed = max(0, all-reduce − τ · inner step), an inner step being its
  compute (6 N B / (R Q)) and its in-data-centre all-reduce. τ = 0: the paper's.
- T = D / B is kept fractional, as the appendix's T is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from fedlm.errors import ConfigError
from fedlm.sim import collectives
from fedlm.sim.links import GBIT

# (bandwidth in bytes/s, latency in s): A.3's 400, 100 and 10 Gbit/s
NETWORKS = {"high": (400 * GBIT, 1e-4), "medium": (100 * GBIT, 1e-3),
            "low": (10 * GBIT, 1e-2)}
PAPER_Q = 300e12  # FLOP/s per chip (A.3: between TPU v5e's and v6e's at 50% of peak)
TARGETS = (0.5, 0.8, 0.9, 0.95, 0.99)  # compute utilisations Table 6 asks for
# said in ``report`` (and so in ``fedlm plan --walltime --json``), whose keys carry no unit
UNITS = {"intra_bw, inter_bw, inter_bw_for": "bytes/s", "bytes_per_param": "bytes",
         "latencies and times": "s", "flops_per_chip": "FLOP/s"}


@dataclass(frozen=True)
class WallInput:
    """Appendix A's inputs. Bandwidths in bytes/s, latencies in seconds."""

    params: float  # N
    tokens: float  # D
    batch: float  # B, tokens per global step
    chips: float  # R
    flops_per_chip: float = PAPER_Q  # Q
    replicas: int = 2  # M
    H: int = 30  # the paper's synchronisation cadence
    intra_bw: float = NETWORKS["high"][0]  # W0
    intra_latency: float = NETWORKS["high"][1]  # ε0
    inter_bw: float = NETWORKS["low"][0]  # W1
    inter_latency: float = NETWORKS["low"][1]  # ε1
    bytes_per_param: float = 2.0  # a parameter's size on the wire (bfloat16, the paper's)
    fragments: int = 1  # P (Streaming DiLoCo)
    overlap: int = 0  # τ, inner steps an outer all-reduce may hide behind

    def check(self) -> WallInput:
        def need(ok: bool, name: str, value, why: str) -> None:
            if not ok:
                raise ConfigError(f"{name}: {why}, got {value!r}")

        for name in ("params", "tokens", "batch", "chips", "flops_per_chip", "intra_bw",
                     "inter_bw", "bytes_per_param"):
            v = getattr(self, name)
            need(math.isfinite(v) and v > 0, name, v, "must be > 0")
        for name in ("intra_latency", "inter_latency"):
            v = getattr(self, name)
            need(math.isfinite(v) and v >= 0, name, v, "must be >= 0")
        need(self.replicas >= 1, "replicas", self.replicas, "must be >= 1")
        need(self.chips >= self.replicas and self.chips % self.replicas == 0, "chips",
             self.chips, f"must be a multiple of the {self.replicas} replicas (R/M chips each)")
        need(self.H >= 1, "H", self.H, "must be >= 1")
        need(1 <= self.fragments and self.H % self.fragments == 0, "fragments",
             self.fragments, f"must divide H = {self.H}")
        need(0 <= self.overlap < self.H // self.fragments, "overlap", self.overlap,
             f"must be >= 0 and < H/P = {self.H // self.fragments}")
        return self

    @property
    def steps(self) -> float:
        """T = D / B."""
        return self.tokens / self.batch


@dataclass(frozen=True)
class WallTime:
    """One algorithm's idealized training time, in seconds."""

    algorithm: str
    steps: float  # T
    compute: float  # 6ND / (RQ)
    inner_comm: float  # the per-step all-reduces (Data-Parallel: all of it)
    outer_comm: float  # the outer all-reduces, exposed (hidden part not counted)
    outer_hidden: float  # outer communication hidden behind compute (overlap)
    total: float
    compute_utilisation: float


def walltime(inp: WallInput, algorithm: str) -> WallTime:
    """``algorithm``: "data-parallel", "diloco-m1" (M = 1) or "diloco" (M replicas)."""
    inp.check()
    n, r, t = inp.params, inp.chips, inp.steps
    allreduce = collectives.allreduce_bound_seconds  # A.2's (module doc)
    model_bytes = n * inp.bytes_per_param
    compute = 6 * n * inp.tokens / (r * inp.flops_per_chip)
    step_compute = compute / t  # 6 N B / (R Q)
    across = allreduce(model_bytes, r, inp.inter_bw, inp.inter_latency)  # all R chips, over W1
    hidden = 0.0
    if algorithm == "data-parallel":
        inner, outer = t * across, 0.0
    else:
        if algorithm == "diloco-m1":
            inner_step = across  # the one replica spans the data centres
        elif algorithm == "diloco":
            inner_step = allreduce(model_bytes, r / inp.replicas, inp.intra_bw,
                                   inp.intra_latency)
        else:
            raise ValueError(f"unknown algorithm {algorithm!r}")
        inner = t * inner_step
        p = inp.fragments
        frag = allreduce(n / p * inp.bytes_per_param, r, inp.inter_bw, inp.inter_latency)
        window = inp.overlap * (step_compute + inner_step)
        syncs = t / inp.H * p  # fragment exchanges in all
        outer = syncs * max(0.0, frag - window)
        hidden = syncs * min(frag, window)
    total = compute + inner + outer
    return WallTime(algorithm, t, compute, inner, outer, hidden, total, compute / total)


def algorithms(inp: WallInput) -> list[str]:
    """Data-Parallel, DiLoCo M = 1 and, if M ≥ 2, DiLoCo with M replicas (Figure 6's set)."""
    return ["data-parallel", "diloco-m1"] + (["diloco"] if inp.replicas >= 2 else [])


def label(inp: WallInput, algorithm: str) -> str:
    return {"data-parallel": "Data-Parallel", "diloco-m1": f"DiLoCo M=1, H={inp.H}",
            "diloco": f"DiLoCo M={inp.replicas}, H={inp.H}"
                      + (f", P={inp.fragments}" if inp.fragments > 1 else "")
                      + (f", overlap {inp.overlap}" if inp.overlap else "")}[algorithm]


def bandwidth_for(inp: WallInput, algorithm: str, utilisation: float) -> float:
    """The W1 (bytes/s) at which ``algorithm`` reaches ``utilisation`` (Table 6's question,
    in this model): bisection on log W1; inf if latency alone forbids it."""
    def util(bw: float) -> float:
        return walltime(replace(inp, inter_bw=bw), algorithm).compute_utilisation

    lo, hi = 1e3 / 8, 1e18 / 8  # 1 kbit/s to 1 Ebit/s: past any network, either way
    if util(hi) < utilisation:
        return math.inf
    if util(lo) >= utilisation:
        return lo
    a, b = math.log(lo), math.log(hi)
    while b - a > 1e-7:
        m = 0.5 * (a + b)
        if util(math.exp(m)) < utilisation:
            a = m
        else:
            b = m
    return math.exp(b)


def report(inp: WallInput) -> dict:
    """Every algorithm's time and the W1 each needs for Table 6's utilisations."""
    inp.check()
    return {"units": UNITS,
            "input": {**asdict(inp), "steps": inp.steps,
                      "step_compute": 6 * inp.params * inp.batch
                      / (inp.chips * inp.flops_per_chip)},
            "algorithms": {a: {**asdict(walltime(inp, a)), "label": label(inp, a),
                               "inter_bw_for": {f"{u:g}": bandwidth_for(inp, a, u)
                                                for u in TARGETS}}
                           for a in algorithms(inp)}}
