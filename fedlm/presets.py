"""Model shapes by preset name, without torch.

The config is validated against this table (``model = "small"``) before any
model exists, so it lives apart from ``fedlm.model``, which builds the network
from it and needs torch.
"""

from __future__ import annotations

# name -> (n_layer, d_model, n_head, head_dim). The paper's shapes keep their
# names (20m, 60m, 150m) although a byte vocabulary makes them smaller than the
# paper's 32k-vocab models: the difference is all in the embedding table.
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 64, 2, 32),  # tests: ~0.1M parameters
    "small": (4, 192, 4, 48),  # default: ~1.8M parameters, learns within minutes on 2 cores
    "20m": (6, 256, 4, 64),  # paper's 20M shape
    "60m": (3, 896, 16, 64),  # paper's 60M shape
    "150m": (12, 896, 16, 64),  # paper's 150M shape
}


def parameter_count(preset: str, block_size: int, vocab_size: int = 256) -> int:
    """Parameters of ``fedlm.model.GPT`` for ``preset``, counted without building it
    (tied embeddings: the output layer adds none); a test checks it
    against the model (``tests/test_scale_limits.py``)."""
    n_layer, d_model, n_head, head_dim = PRESETS[preset]
    inner = n_head * head_dim
    block = (4 * d_model  # two LayerNorms, weight and bias
             + 3 * d_model * inner + inner * d_model  # qkv, proj
             + 2 * 4 * d_model * d_model)  # MLP up, down
    return vocab_size * d_model + block_size * d_model + n_layer * block + 2 * d_model
