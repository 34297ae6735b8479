"""The tokenizers: ``byte`` (one id per UTF-8 byte) and ``bpe:V`` (byte-level BPE).

``data.tokenizer = "bpe:V"`` trains a byte-level BPE of vocabulary V (GPT-2's
scheme, Hugging Face ``tokenizers``) on the training split only: the validation
text never shapes the merges, so its perplexity is not flattered. Training is
deterministic (the same texts and V give the same JSON and the same ids: the
trainer breaks ties between equally frequent pairs by their ids, which follow
the sorted alphabet and the merge order, not hash order or threads), and its
JSON is cached beside the tokenized corpus (``fedlm.data.cache``).

Per-token perplexity depends on the tokenizer (a token of 3 bytes is harder to
guess than one byte), so every evaluation also reports bits per byte: total
nats / (ln 2 × UTF-8 bytes the scored tokens decode to). ``token_bytes`` gives
each id's byte length; for ``byte`` every id is one byte and bits per byte is
log2(perplexity).

``tokenizers`` is imported inside the functions that train or encode: the
config check parses the spec here and must stay fast.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Iterable

import numpy as np

from fedlm.errors import ConfigError, shown

BYTE_VOCAB = 256  # the byte tokenizer's ids, and the BPE's initial alphabet
# uint16 token ids: V = 65536 is the largest vocabulary whose ids fit (0..65535)
MAX_VOCAB = 65536
SPEC_HELP = f"must be 'byte' or 'bpe:V' with V an integer from {BYTE_VOCAB + 1} to {MAX_VOCAB}"


def bpe_vocab(spec: str) -> int | None:
    """V of ``bpe:V``; None for ``byte``. Any other spec is a one-line ConfigError."""
    if spec == "byte":
        return None
    kind, _, number = spec.partition(":")
    # isdecimal, not int(): int() accepts "+512", " 512" and "5_12", which would give
    # one tokenizer several spellings (and several cache entries)
    if kind == "bpe" and number.isascii() and number.isdecimal() and not number.startswith("0"):
        vocab = int(number)
        if BYTE_VOCAB < vocab <= MAX_VOCAB:
            return vocab
    raise ConfigError(f"data.tokenizer: {SPEC_HELP}, got {shown(spec)}")


def vocab_size(spec: str) -> int:
    """The model's vocabulary under this tokenizer (its embedding rows)."""
    return bpe_vocab(spec) or BYTE_VOCAB


def token_dtype(spec: str) -> type:
    """The narrowest unsigned type of the ids: uint8 for bytes (as before tokenizers were
    a setting), uint16 for BPE (V <= 65536)."""
    return np.uint8 if bpe_vocab(spec) is None else np.uint16


# ---------------------------------------------------------------------------
# Byte-level BPE
# ---------------------------------------------------------------------------

def train_bpe(texts: Iterable[str], vocab: int) -> str:
    """A byte-level BPE of ``vocab`` ids trained on ``texts``, as the tokenizer's JSON.

    The 256 bytes are the initial alphabet (ids 0..255 are bytes in GPT-2's
    printable order), so any text encodes, nothing is unknown and no special token
    is added. A corpus too small for V - 256 merges gives fewer ids: the model
    still has V rows, the extra ones never seen.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok.to_str()


def checked_bpe(text: str, vocab: int) -> str:
    """``text`` if it is a byte-level BPE tokenizer's JSON of at most ``vocab`` ids that
    the ``tokenizers`` library loads; else ValueError saying what is wrong."""
    try:
        model = json.loads(text)["model"]
        ids = model["vocab"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ValueError(f"not a tokenizer's JSON ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:80] if str(exc) else ''})") from None
    if model.get("type") != "BPE" or not isinstance(ids, dict) or not ids or not all(
            isinstance(i, int) and 0 <= i < vocab for i in ids.values()):
        raise ValueError(f"not a BPE of ids below {vocab}")
    try:
        _loaded(text)
    except Exception as exc:  # noqa: BLE001 - the library's own parse error
        raise ValueError(f"the tokenizers library cannot load it ({str(exc)[:80]})") from None
    token_bytes(f"bpe:{vocab}", text)  # byte-level, every token (ValueError if not)
    return text


def library_version() -> str:
    """The ``tokenizers`` version, part of the cache key: another version may merge
    differently, and a cached tokenizer must be the one this process would train."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tokenizers")
    except PackageNotFoundError:
        raise ConfigError("data.tokenizer: 'bpe:V' needs the tokenizers package "
                          "(pip install tokenizers)") from None


@lru_cache(maxsize=4)
def _loaded(tokenizer_json: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


def encode_bpe(tokenizer_json: str, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in _loaded(tokenizer_json).encode_batch(texts)]


def decode_bpe(tokenizer_json: str, ids) -> str:
    return _loaded(tokenizer_json).decode([int(i) for i in ids])


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted: the byte-level BPE writes
    byte b as this character, so a token's string is its bytes, one character each."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = {}
    extra = 0
    for b in range(BYTE_VOCAB):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(BYTE_VOCAB + extra)] = b
            extra += 1
    return chars


def token_bytes(spec: str, tokenizer_json: str | None = None) -> np.ndarray:
    """UTF-8 bytes each id stands for, shape (vocab_size,): all ones for ``byte``.

    Ids the BPE never made (a small corpus) count 0; they are never produced.
    """
    vocab = vocab_size(spec)
    if tokenizer_json is None:
        if bpe_vocab(spec) is not None:
            raise ValueError("a BPE tokenizer's byte lengths need its JSON")
        return np.ones(vocab, dtype=np.int64)
    byte_of = _byte_of_char()
    lengths = np.zeros(vocab, dtype=np.int64)
    for token, i in json.loads(tokenizer_json)["model"]["vocab"].items():
        if any(c not in byte_of for c in token):  # not a byte-level token: refuse to guess
            raise ValueError(f"token {token!r} is not byte-level")
        lengths[i] = len(token)
    return lengths
