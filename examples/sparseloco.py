"""SparseLoCo as a fedlm plug-in: each worker sends only the largest 2% of its outer
gradient's values (top-k in chunks), each in 2 bits, and keeps the rest in a decaying
error-feedback accumulator, which stands in for DiLoCo's outer momentum. A codec; the
outer step is fedlm's own ``fedavg`` (a plain average, lr 1, no momentum).

Source: Sarfi, Thérien, Lidin, Belilovsky, "Communication Efficient LLM Pre-training
with SparseLoCo", arXiv 2508.15706, 2025 (code: github.com/tplr-ai/SparseLoCo). Per
worker r, after its H inner steps give Δ_r:

    e_r ← β·e_r + Δ_r                                  error feedback, decayed
    Δ̂_r = Q(TopK(e_r))                                 top-k per chunk, then 2 bits
    e_r ← e_r − Δ̂_r                                    what was not sent stays
    θ ← θ − α·mean_r(Δ̂_r)                              the server: ``fedavg``, α = 1

TopK: each tensor, flattened and padded with zeros to chunks of ``CHUNK`` (256) values,
keeps the ``TOP_K`` (8: 3.125%) largest |e| of every chunk, ties to the lower index; Q:
MuLoCo's 2-bit quantiser (``muloco.quantise``: shift by the mean, 4 levels 1.5σ wide,
each decoded as the mean of its values) over a tensor's kept values. Wire, a tensor:
one byte a kept value's index in its chunk, 4 codes a byte, 5 fp32 numbers. The paper's
text past its abstract could not be read here; its public code (tplr-ai/SparseLoCo, read
in a fork) keeps 128 values of each 64 x 64 tile (3.125%), the density taken here, and
its sweep decays the error by β = ``DECAY`` = 0.95, as here; its quantiser is the one
above (shift by the mean, 6σ over 4 bins). Class attributes a subclass changes.

Departures from that code, fedlm's: flat 256-value chunks of a flattened tensor
(zero-padded; the code's 2-D tiles never pad), no DCT, and the server's ``fedavg``
divides each coordinate by all R workers where the code averages it over the workers
that sent it.

    PYTHONPATH=examples fedlm run --set model=tiny --set strategy=fedavg \\
        --set network.compression=sparseloco:SparseLoCo
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from fedlm.params import BadUpdate
from muloco import EF_PREFIX, LEVELS, check_part, dequantise, quantise

SOURCE = ("reconstruction of Sarfi et al. 2025 (arXiv 2508.15706) after its public code: "
          "error feedback decayed 0.95, top 3.125% per chunk, 2 bits; fedlm's: flat chunks, "
          "no DCT, the mean over all workers")


class SparseLoCo:
    """The ``network.compression`` codec: chunk-wise top-k, 2 bits, decaying error feedback."""

    CHUNK = 256  # values a chunk (at most 256: an index is one byte)
    TOP_K = 8  # kept a chunk: 8 / 256 = 3.125%, the reference code's density
    DECAY = 0.95  # β: the accumulator's decay

    def chunks(self, n: int) -> int:
        return -(-n // self.CHUNK)

    def rows(self, e: torch.Tensor) -> torch.Tensor:
        """``e`` flattened, padded with zeros and cut into chunks: (chunks, CHUNK)."""
        flat = e.reshape(-1)
        pad = self.chunks(flat.numel()) * self.CHUNK - flat.numel()
        return torch.nn.functional.pad(flat, (0, pad)).view(-1, self.CHUNK)

    def positions(self, idx: torch.Tensor) -> torch.Tensor:
        """Flat positions of the kept values, from their indices within each chunk."""
        idx = idx.long().view(-1, self.TOP_K)
        base = torch.arange(len(idx), device=idx.device).unsqueeze(1) * self.CHUNK
        return (idx + base).reshape(-1)

    def select(self, rows: torch.Tensor) -> torch.Tensor:
        """Each chunk's TOP_K largest |e|, as indices within the chunk (uint8, in order)."""
        # a stable sort, largest first: equal magnitudes keep the lower index
        order = rows.abs().argsort(dim=1, descending=True, stable=True)[:, :self.TOP_K]
        return order.sort(dim=1).values.reshape(-1).to(torch.uint8)

    def scatter(self, idx: torch.Tensor, values: torch.Tensor, shape) -> torch.Tensor:
        """The kept values back in place, zeros elsewhere, shaped ``shape``."""
        n = int(torch.Size(shape).numel())
        out = values.new_zeros(self.chunks(n) * self.CHUNK)
        out[self.positions(idx)] = values
        return out[:n].view(shape)

    def encode(self, grad, state, net):
        payload, errors = OrderedDict(), {}
        for name, g in grad.items():
            e = self.DECAY * state[EF_PREFIX + name] + g if EF_PREFIX + name in state else g
            rows = self.rows(e)
            idx = self.select(rows)
            packed, meta = quantise(rows.reshape(-1)[self.positions(idx)])
            payload[f"{name}/idx"], payload[f"{name}/q"] = idx, packed
            payload[f"{name}/meta"] = meta
            if net.error_feedback:
                sent = dequantise(packed, meta, idx.numel())
                errors[EF_PREFIX + name] = e - self.scatter(idx, sent, e.shape)
        return payload, errors

    def decode(self, payload, reference, net):
        expected = {f"{n}/{part}" for n in reference for part in ("idx", "q", "meta")}
        if set(payload) != expected:
            raise BadUpdate(f"top-k payload: tensors {sorted(set(payload) ^ expected)[:4]} "
                            f"missing or unexpected")
        out = OrderedDict()
        for name, ref in reference.items():
            kept = self.chunks(ref.numel()) * self.TOP_K
            check_part(f"{name}/idx", payload[f"{name}/idx"], torch.uint8, kept)
            check_part(f"{name}/q", payload[f"{name}/q"], torch.uint8, -(-kept // 4))
            check_part(f"{name}/meta", payload[f"{name}/meta"], torch.float32, 1 + LEVELS)
            idx = payload[f"{name}/idx"]
            if bool((idx.long() >= self.CHUNK).any()):
                raise BadUpdate(f"{name}/idx: an index past its chunk of {self.CHUNK}")
            values = dequantise(payload[f"{name}/q"], payload[f"{name}/meta"], kept)
            out[name] = self.scatter(idx, values, ref.shape)
        return out

    def payload_bytes(self, reference, net) -> int:
        total = 0
        for t in reference.values():
            kept = self.chunks(t.numel()) * self.TOP_K
            total += kept + -(-kept // 4) + 4 * (1 + LEVELS)
        return total
