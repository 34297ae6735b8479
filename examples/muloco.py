"""MuLoCo as a fedlm plug-in: DiLoCo with Muon as the inner optimizer and outer
gradients sent as 2 bits a value with error feedback. Two plug-in points, no strategy:
the outer step is fedlm's own ``diloco``.

Source: Thérien, Huang, Rish, Belilovsky, "MuLoCo: Muon is a practical inner optimizer
for DiLoCo", arXiv 2505.23725, 2025: Muon inside, the delta compressed to 2 bits with an
error-feedback accumulator, DiLoCo's outer Nesterov on the average.

``muon`` (``inner.optimizer``): Muon for the 2-D weights inside the transformer blocks,
AdamW for the rest (embeddings, the tied output head, gains and biases), as Muon's
reference code does (K. Jordan, github.com/KellerJordan/Muon, ``MuonWithAuxAdam``):

    matrices:  b ← β·b + (1 − β)·∇;   u = (1 − β)·∇ + β·b            (Nesterov, β 0.95)
               O = NS₅(u)  (5 Newton-Schulz steps towards the orthogonal factor of u:
                            X ← aX + (bA + cA²)X, A = XXᵀ, (a, b, c) = (3.4445, −4.7750, 2.0315))
               θ ← θ·(1 − η·λ) − η · 0.2·√max(rows, cols) · O
    the rest:  AdamW (β₁, β₂ = inner.beta1/beta2, ε 1e-8, decoupled weight decay λ)

η and λ are the inner schedule's learning rate and ``inner.weight_decay`` for both: the
0.2·√max(rows, cols) scale (Moonshot's "match the RMS of AdamW", torch.optim.Muon's
``match_rms_adamw``) lets Muon share AdamW's settings, where the reference scales by
√max(1, rows/cols) and gives Muon a learning rate of its own (0.02).

``TwoBit`` (``network.compression``): each tensor x = g + e (e: the worker's error from
its last accepted job) quantised to 4 levels, as SparseLoCo/MuLoCo-style code does:

    shift = mean(x);  s = 6·std(x)/4;  code = clamp(round((x − shift)/s + 2), 0, 3)
    level_k = mean of (x − shift) over the values of code k (0 if none)
    decoded = level_code + shift;   e ← x − decoded            (error feedback)
    wire: 4 codes a byte, and 5 fp32 numbers (shift, 4 levels) a tensor

Simplified: Newton-Schulz in fp32 (the reference runs it in bf16); the quantiser is one
per tensor (no chunks); the error accumulator does not decay.

    PYTHONPATH=examples fedlm run --set model=tiny --set strategy=diloco \\
        --set inner.optimizer=muloco:muon --set network.compression=muloco:TwoBit
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

from fedlm.params import BadUpdate

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
SOURCE = ("reconstruction of Therien et al. 2025 (arXiv 2505.23725, abstract): Muon inside "
          "(Jordan's MuonWithAuxAdam split), a 2-bit delta with error feedback; the quantiser "
          "is SparseLoCo's code's, per tensor, its error undecayed: fedlm's choices")
EF_PREFIX = "ef/"  # the worker keeps error feedback under these names (fedlm.sim.codecs)


# -- Muon inside ------------------------------------------------------------------------

def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The quintic Newton-Schulz iteration towards the orthogonal factor of ``g`` (2-D)."""
    a, b, c = NS_COEFFICIENTS
    x = g / (g.norm() + 1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        xx = x @ x.T
        x = a * x + (b * xx + c * xx @ xx) @ x
    return x.T if tall else x


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer, two kinds of group: ``use_muon`` (Muon) and the rest (AdamW)."""

    def __init__(self, groups, *, lr: float, weight_decay: float) -> None:
        super().__init__(groups, dict(lr=lr, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = (self._muon if group["use_muon"] else self._adam)(p, group)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"])

    def _muon(self, p, group) -> torch.Tensor:
        state, beta = self.state[p], group["momentum"]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p)
        buf = state["momentum_buffer"]
        buf.lerp_(p.grad, 1 - beta)
        update = newton_schulz(p.grad.lerp(buf, beta), group["ns_steps"])
        return update * (0.2 * math.sqrt(max(p.shape)))

    def _adam(self, p, group) -> torch.Tensor:
        state, (beta1, beta2) = self.state[p], group["betas"]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
        state["step"] += 1
        t = float(state["step"])
        state["exp_avg"].lerp_(p.grad, 1 - beta1)
        state["exp_avg_sq"].lerp_(p.grad.square(), 1 - beta2)
        denom = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt().add_(group["eps"])
        return state["exp_avg"] / (1 - beta1 ** t) / denom


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """Muon's parameters: 2-D weights inside the blocks, not the embeddings (nor the
    output head, which this model ties to the token embedding)."""
    return p.dim() == 2 and "emb" not in name


def muon(parameters, inner) -> MuonAdamW:
    """The ``inner.optimizer`` factory: Muon for hidden matrices, AdamW for the rest."""
    parameters = list(parameters)
    hidden = [(n, p) for n, p in parameters if is_hidden_matrix(n, p)]
    rest = [(n, p) for n, p in parameters if not is_hidden_matrix(n, p)]
    return MuonAdamW([dict(params=hidden, use_muon=True, momentum=0.95, ns_steps=5),
                      dict(params=rest, use_muon=False, betas=(inner.beta1, inner.beta2),
                           eps=1e-8)],
                     lr=inner.lr, weight_decay=inner.weight_decay)


# -- 2 bits on the wire -------------------------------------------------------------------

LEVELS, RANGE_IN_SIGMAS = 4, 6.0


def quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A 1-D tensor as 2-bit codes (4 a byte) and its 5 numbers (shift, 4 levels)."""
    shift = x.mean()
    centred = x - shift
    std = centred.norm() / math.sqrt(x.numel() - 1) if x.numel() > 1 else centred.norm() * 0
    scale = RANGE_IN_SIGMAS * std / LEVELS
    scale = scale if float(scale) > 0 and math.isfinite(float(scale)) else scale.new_ones(())
    codes = (centred / scale + LEVELS // 2).round().clamp(0, LEVELS - 1).to(torch.uint8)
    levels = [centred[codes == k].mean() if bool((codes == k).any()) else centred.new_zeros(())
              for k in range(LEVELS)]  # the mean of each bin, one bin at a time (no atomics)
    meta = torch.stack([shift, *levels]).float()
    return pack(codes), meta


def dequantise(packed: torch.Tensor, meta: torch.Tensor, n: int) -> torch.Tensor:
    return meta[1:][unpack(packed, n).long()] + meta[0]


def pack(codes: torch.Tensor) -> torch.Tensor:
    pad = (-codes.numel()) % 4
    c = torch.cat([codes, codes.new_zeros(pad)]).view(-1, 4)
    return c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    return torch.stack([(packed >> s) & 3 for s in (0, 2, 4, 6)], dim=1).reshape(-1)[:n]


def check_part(name: str, t, dtype, numel: int) -> None:
    """A payload tensor must be what ``encode`` sends: refused like a NaN otherwise."""
    if not (isinstance(t, torch.Tensor) and t.dtype == dtype and t.dim() == 1
            and t.numel() == numel):
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise BadUpdate(f"{name}: {got}, expected {dtype} ({numel},)")


class TwoBit:
    """The ``network.compression`` codec: 2 bits a value, error feedback on the worker."""

    def encode(self, grad, state, net):
        payload, errors = OrderedDict(), {}
        for name, g in grad.items():
            x = g + state[EF_PREFIX + name] if EF_PREFIX + name in state else g
            packed, meta = quantise(x.reshape(-1))
            payload[f"{name}/q"], payload[f"{name}/meta"] = packed, meta
            if net.error_feedback:
                errors[EF_PREFIX + name] = x - dequantise(packed, meta, x.numel()).view(x.shape)
        return payload, errors

    def decode(self, payload, reference, net):
        expected = {f"{n}/{part}" for n in reference for part in ("q", "meta")}
        if set(payload) != expected:
            raise BadUpdate(f"2-bit payload: tensors {sorted(set(payload) ^ expected)[:4]} "
                            f"missing or unexpected")
        out = OrderedDict()
        for name, ref in reference.items():
            check_part(f"{name}/q", payload[f"{name}/q"], torch.uint8, -(-ref.numel() // 4))
            check_part(f"{name}/meta", payload[f"{name}/meta"], torch.float32, 1 + LEVELS)
            out[name] = dequantise(payload[f"{name}/q"], payload[f"{name}/meta"],
                                   ref.numel()).view(ref.shape)
        return out

    def payload_bytes(self, reference, net) -> int:
        return sum(-(-t.numel() // 4) + 4 * (1 + LEVELS) for t in reference.values())
