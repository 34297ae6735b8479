"""Validation of the global model on the held-out split.

The same fixed validation sequences every time (the first ``batches ×
batch_size`` of the split, which no worker trains on), so evaluations of a run,
and of different runs, compare like with like.

Perplexity is per token, so it compares only runs of one tokenizer; bits per
byte compares any: the same nats spread over the UTF-8 bytes the scored tokens
decode to (``data.tokenizer``: one byte per token for ``byte``, where it is
log2(perplexity); a few per token for ``bpe:V``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedlm import data, model as model_lib
from fedlm.config import Config
from fedlm.model import load_into


@dataclass(frozen=True)
class Evaluation:
    loss: float  # mean cross-entropy per token, nats
    perplexity: float  # exp(loss), per token
    bits_per_byte: float  # total nats / (ln 2 x UTF-8 bytes of the scored tokens)
    tokens: int  # validation tokens scored


def bits_per_byte(mean_loss: float, tokens: int, utf8_bytes: int) -> float:
    """``tokens`` scored at ``mean_loss`` nats each, over the ``utf8_bytes`` they decode
    to, in bits per byte. Written as mean × (tokens / bytes) so that one byte per token
    gives mean / ln 2 to the bit, as before tokenizers were a setting."""
    return mean_loss * (tokens / utf8_bytes) / math.log(2)


class Evaluator:
    """Holds a scratch model and the validation batches; ``__call__`` scores params."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.device = model_lib.resolve_device(cfg.device)
        self.net = model_lib.blank(cfg.model, cfg.data.seq_len, device=self.device,
                                   vocab_size=data.vocab_size(cfg.data))
        corpus = data.load_corpus(cfg.data)
        val = corpus.val
        n = min(len(val), cfg.eval.batches * cfg.eval.batch_size)
        # Uploaded once and kept on the device: every evaluation scores the same batches.
        self.val = torch.from_numpy(val[:n].astype(np.int64)).to(self.device)  # (n, T+1)
        # the UTF-8 bytes the scored targets decode to: fixed, so counted once
        self.val_bytes = int(corpus.token_bytes[val[:n, 1:]].sum())

    @torch.no_grad()
    def __call__(self, params) -> Evaluation:
        # Always fp32, whatever inner.precision: evaluations compare across settings.
        torch.set_num_threads(self.cfg.inner.threads)
        load_into(self.net, params)
        self.net.eval()
        losses, sizes = [], []
        for seqs in self.val.split(self.cfg.eval.batch_size):
            _, loss = self.net(seqs[:, :-1], seqs[:, 1:])
            losses.append(loss)
            sizes.append(seqs[:, 1:].numel())
        total, count = 0.0, 0
        for value, n in zip(torch.stack(losses).tolist(), sizes):  # one read from the device
            total += value * n
            count += n
        mean = total / count
        # a diverged model's loss may pass exp's range (~709): infinite perplexity, not an
        # OverflowError, so that the engine can say the run diverged (eval.diverge_factor)
        ppl = math.inf if mean > 709.0 else math.exp(mean)
        return Evaluation(mean, ppl, bits_per_byte(mean, count, self.val_bytes), count)
