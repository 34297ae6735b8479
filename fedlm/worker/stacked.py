"""``fedlm.model.GPT``'s forward pass over K replicas at once, each with its own weights.

The weights are stacked: every tensor of the model's ``named_parameters`` gets a
leading replica dimension (K, *shape), and each layer runs once for all K
(``torch.bmm`` for the linear layers, the attention of K·B sequences in one
``scaled_dot_product_attention``), so a CPU pays one op's overhead where K
separate models would pay K. Replica k reads only row k of every tensor, and its
loss depends on nothing else: gradients of the summed losses are each replica's
own. The arithmetic is GPT's, with matmuls batched (so sums may run in another
order: equal to the per-model forward within rounding, not to the bit).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedlm.model import ModelConfig


def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (K, N, in) @ w (K, out, in)ᵀ -> (K, N, out): nn.Linear without bias, per replica."""
    return torch.bmm(x, w.transpose(1, 2))


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """LayerNorm over the last dim with each replica's own (K, C) scale and shift."""
    y = F.layer_norm(x, x.shape[-1:])
    return torch.addcmul(b.unsqueeze(1), y, w.unsqueeze(1))


def _attention(x: torch.Tensor, p: dict, pre: str, cfg: ModelConfig, batch: int):
    K, N, _ = x.shape  # N = batch · T
    T, H, D = N // batch, cfg.n_head, cfg.head_dim
    qkv = _linear(x, p[pre + "qkv.weight"]).view(K * batch, T, 3 * H * D)
    q, k, v = (t.view(K * batch, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=2))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (K·B, H, T, D)
    y = y.transpose(1, 2).reshape(K, N, H * D)
    return _linear(y, p[pre + "proj.weight"])


def _block(x: torch.Tensor, p: dict, i: int, cfg: ModelConfig, batch: int) -> torch.Tensor:
    pre = f"blocks.{i}."
    h = _layer_norm(x, p[pre + "ln1.weight"], p[pre + "ln1.bias"])
    x = x + _attention(h, p, pre + "attn.", cfg, batch)
    h = _layer_norm(x, p[pre + "ln2.weight"], p[pre + "ln2.bias"])
    return x + _linear(F.gelu(_linear(h, p[pre + "mlp.up.weight"])), p[pre + "mlp.down.weight"])


def losses(p: dict, idx: torch.Tensor, targets: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Each replica's mean cross-entropy, (K,): replica k's weights ``p[name][k]`` on its
    tokens ``idx[k]`` (B, T) against ``targets[k]``. Tied embeddings as in GPT."""
    K, B, T = idx.shape
    tok = p["tok_emb.weight"]  # (K, V, C)
    V, C = tok.shape[1:]
    # replica k's rows of the stacked table start at k·V
    rows = idx + (torch.arange(K, device=idx.device) * V).view(K, 1, 1)
    x = F.embedding(rows, tok.reshape(K * V, C)) + p["pos_emb.weight"][:, None, :T]
    x = x.reshape(K, B * T, C)
    for i in range(cfg.n_layer):
        x = _block(x, p, i, cfg, B)
    x = _layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = torch.bmm(x, tok.transpose(1, 2))  # (K, B·T, V)
    each = F.cross_entropy(logits.reshape(K * B * T, V).float(), targets.reshape(-1),
                           reduction="none")
    return each.view(K, B * T).mean(dim=1)
