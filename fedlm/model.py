"""A compact decoder-only transformer (GPT) for the workers' local replicas.

Pre-norm blocks, causal self-attention through ``F.scaled_dot_product_attention``,
learned positions, tied input/output embeddings. Read top to bottom, nanoGPT style.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from fedlm.errors import ConfigError
from fedlm.presets import PRESETS, parameter_count  # PRESETS: name -> (n_layer, d_model, ...)


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int  # transformer blocks
    d_model: int  # residual stream width
    n_head: int  # attention heads
    head_dim: int  # key/value size per head (the paper uses 64)
    vocab_size: int = 256  # the tokenizer's ids (data.tokenizer; 256: bytes)
    block_size: int = 128  # maximum context length


def model_config(preset: str, block_size: int, vocab_size: int = 256) -> ModelConfig:
    n_layer, d_model, n_head, head_dim = PRESETS[preset]
    return ModelConfig(n_layer, d_model, n_head, head_dim, vocab_size, block_size)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        inner = cfg.n_head * cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * inner, bias=False)
        self.proj = nn.Linear(inner, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split(self.n_head * self.head_dim, dim=2)  # 3 x (B, T, H*D)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)  # (B, T, H*D)
        return self.proj(y)  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.down = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))  # pre-norm residual
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied embeddings
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith(("proj.weight", "down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))
        return logits, loss


def build(preset: str, block_size: int, seed: int, device: str = "cpu",
          vocab_size: int = 256) -> GPT:
    """A freshly initialised model; the same seed gives the same weights.

    ``vocab_size`` follows the tokenizer (``fedlm.data.vocab_size``); 256 is bytes.
    """
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = GPT(model_config(preset, block_size, vocab_size))
    torch.random.set_rng_state(gen_state)  # leave the caller's RNG untouched
    return model.to(device)


BLANK_ABOVE = 20_000_000  # parameters: a larger scratch model is built uninitialised


def blank(preset: str, block_size: int, device: str = "cpu", vocab_size: int = 256) -> GPT:
    """The model's structure on ``device`` with its weights uninitialised (built on the
    meta device, then given empty storage there): for a model whose weights are loaded
    before any use (a worker's scratch model, the evaluator's, pretraining's), so that
    no random initialisation is paid for (150m: about 1.7 s of host time a build, 60m
    0.45 s). Below ``BLANK_ABOVE`` parameters they are initialised as ever: their init
    costs less than the first use of the meta device in a process (about 2 s: its
    kernels' import)."""
    if parameter_count(preset, block_size, vocab_size) < BLANK_ABOVE:
        return build(preset, block_size, seed=0, device=device, vocab_size=vocab_size)
    with torch.device("meta"):
        model = GPT(model_config(preset, block_size, vocab_size))
    model = model.to_empty(device=device)
    model.head.weight = model.tok_emb.weight  # to_empty gives each its own storage: tie again
    return model


def parameter_names(preset: str) -> list[str]:
    """The names of a preset's trainable parameters (a snapshot's keys), from its
    structure alone: built on the meta device, no weights (the names depend on neither
    the block size nor the vocabulary)."""
    with torch.device("meta"):
        return [n for n, _ in GPT(model_config(preset, block_size=8)).named_parameters()]


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def resolve_device(choice: str) -> str:
    """``auto`` picks CUDA when present, CPU otherwise."""
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' asked for but torch sees no CUDA device")
    return choice


# -- the model's weights as a name -> tensor dict (fedlm.params) ------------------

def snapshot(model: torch.nn.Module) -> "OrderedDict[str, torch.Tensor]":
    """A detached CPU copy of the model's trainable parameters, by name.

    Uses ``named_parameters`` so tied weights appear once.
    """
    return OrderedDict((n, p.detach().to("cpu", copy=True)) for n, p in model.named_parameters())


def load_into(model: torch.nn.Module, params) -> None:
    """Copy ``params`` into the model's parameters in place."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
