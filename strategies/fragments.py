"""Streaming DiLoCo's fragments and schedule: which tensors form fragment p, and
which fragment a synchronous round synchronises. Names only, no tensors.

Douillard et al., "Streaming DiLoCo with overlapping communication: Towards a
Distributed Free Lunch", 2025, https://arxiv.org/abs/2501.18512

``stream.fragments = P`` splits the model into P fragments by blocks of
layers, *strided* (the paper's better pattern): transformer block i belongs
to fragment i mod P. Tensors outside the blocks go with their nearest block:
those before the first block (the token and position embeddings) with block
0's fragment, those after the last (the final norm, the head) with the last
block's. So P may be at most the number of blocks.

An outer step of H inner steps becomes P rounds: round r trains
``segment_steps(H, P, r)`` inner steps (fragment p is due at inner step
⌊(p + 1)·H/P⌋ of the outer step: offsets p·H/P, rounded down) and then
synchronises fragment ``r mod P``. Every fragment is thus synchronised once
per H inner steps, as in DiLoCo, but only 1/P of the model travels at a time.

``stream.overlap = τ``: the exchange of round r's fragment overlaps the first
τ inner steps of round r + 1; the worker mixes the new global fragment in at
inner step τ: θ_p ← α·θ_p^global + (1 − α)·θ_p^local, ``stream.mix = α``
(α = 1: take the global fragment, as DiLoCo does). ``mix = "auto"`` (the default)
is the paper's 0.5 with overlap and 1 without: chosen on a tuning seed,
experiments/archive/results/streaming.md has the held-out seeds. P = 1, τ = 0, α = 1 is
DiLoCo, bit for bit.
"""

from __future__ import annotations

import re

_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def block_of(name: str) -> int | None:
    """The transformer block a tensor belongs to (``blocks.3.attn...`` -> 3), or None."""
    m = _BLOCK.match(name)
    return int(m.group(1)) if m else None


def blocks_in(names: list[str]) -> int:
    """How many transformer blocks these tensors have."""
    found = [b for b in map(block_of, names) if b is not None]
    return max(found) + 1 if found else 0


def assign(names: list[str], fragments: int) -> list[int]:
    """The fragment of each tensor, in ``names``' order (the model's order)."""
    blocks = blocks_in(names)
    if fragments < 1:
        raise ValueError(f"stream.fragments: must be >= 1, got {fragments!r}")
    if fragments > max(1, blocks):
        raise ValueError(f"stream.fragments: must be at most the model's {blocks} blocks of "
                         f"layers, got {fragments}")
    out, seen_block = [], False
    for name in names:
        b = block_of(name)
        if b is None:  # before the first block -> block 0; after the last -> the last
            b = blocks - 1 if seen_block else 0
        else:
            seen_block = True
        out.append(b % fragments)
    return out


def fragment_names(names: list[str], fragments: int) -> list[list[str]]:
    """The tensor names of each fragment, each in the model's order."""
    groups: list[list[str]] = [[] for _ in range(fragments)]
    for name, p in zip(names, assign(names, fragments)):
        groups[p].append(name)
    return groups


def round_fragment(round_index: int, fragments: int) -> int:
    """The fragment synchronised at the end of round ``round_index``."""
    return round_index % fragments


def segment_steps(H: int, fragments: int, round_index: int) -> int:
    """Inner steps of round ``round_index``: from one fragment's offset to the next."""
    p = round_index % fragments
    return (p + 1) * H // fragments - p * H // fragments


def changed_since(seen_version: int, version: int, fragments: int) -> list[int]:
    """Fragments a worker that last saw global ``seen_version`` lacks at ``version``:
    version u + 1 is made by round u, which synchronised fragment u mod P."""
    rounds = range(seen_version, version)
    if len(rounds) >= fragments:
        return list(range(fragments))
    return sorted({round_fragment(u, fragments) for u in rounds})


class Streaming:
    """Streaming settings as the server and the worker read them (None: off)."""

    def __init__(self, fragments: int, overlap: int, mix: float) -> None:
        self.fragments, self.overlap, self.mix = fragments, overlap, mix

    @classmethod
    def of(cls, fragments=0, overlap=0, mix="auto") -> "Streaming | None":
        """From the ``stream.*`` values; None (whole-model rounds) when they are the
        defaults: fragments 0, overlap 0, mix "auto" (or 1)."""
        if not (isinstance(fragments, int) and not isinstance(fragments, bool)
                and fragments >= 0):
            raise ValueError(f"stream.fragments: must be an int >= 1 (0: off), got {fragments!r}")
        if not (isinstance(overlap, int) and not isinstance(overlap, bool) and overlap >= 0):
            raise ValueError(f"stream.overlap: must be an int >= 0 (inner steps), got {overlap!r}")
        if mix != "auto" and (isinstance(mix, bool) or not isinstance(mix, (int, float))
                              or not 0 < mix <= 1):
            raise ValueError(f"stream.mix: must be in (0, 1] or 'auto', got {mix!r}")
        if fragments == 0 and overlap == 0 and mix in ("auto", 1):
            return None
        if mix == "auto":  # the paper's 0.5 keeps half of the overlapped steps' progress
            mix = 0.5 if overlap > 0 else 1.0
        return cls(max(1, fragments), overlap, float(mix))

    @classmethod
    def of_config(cls, cfg) -> "Streaming | None":
        """From a config's ``[stream]`` section (the worker's and the servers' view)."""
        s = cfg.stream
        return cls.of(s.fragments, s.overlap, s.mix)
