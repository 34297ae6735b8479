"""Damaged data caches: rebuilt, whole or not at all.

A cache file is fedlm's own, written whole (files.write_cache), but a disk that filled,
a copy cut short or a hand that edited it can leave one that is not. Each is read
whole and checked before it is used; one that fails is said in one line on stderr
and rebuilt from the corpus (written whole, in place of the damaged one). A folder
where a cache file belongs is not fedlm's to remove: the corpus is then rebuilt in
memory each time, and the line says what to remove.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Iterable

import numpy as np

from fedlm import files
from fedlm.data import tokenizer as tok_lib
from fedlm.errors import first_line, shown_key


MAX_JSON = 256 << 20  # bytes of a cached tokenizer, at most (V = 65536: a few MB)


def state(path: Path) -> str:
    """``absent``, ``file`` (a regular file: read it), ``not ours`` (a folder: rebuilt
    in memory, never written over) or ``damaged`` (a FIFO, a socket, a device, an
    unreadable entry: rebuilt, and the new file takes its name)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:  # a link to nowhere, a loop of links, no permission
        damaged(path, exc.strerror or str(exc))
        return "damaged"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        print(f"fedlm: the data cache {shown_key(str(path))} is a folder, not fedlm's file; "
              f"the data is rebuilt in memory for this run (remove the folder to cache it "
              f"again)", file=sys.stderr, flush=True)
        return "not ours"
    damaged(path, f"{files.kind(st.st_mode)}, not a file")  # reading it could block
    return "damaged"


def why(exc: BaseException) -> str:
    """What numpy or pyarrow said of a damaged file, short (numpy's advice to unpickle a
    file that is not an archive is no advice here)."""
    text = first_line(exc) or type(exc).__name__
    return "not a numpy archive" if "allow_pickle" in text else text[:120]


def damaged(path: Path, reason: str) -> None:
    """Say, in one line, that a cache file is damaged and is being rebuilt."""
    print(f"fedlm: the data cache {shown_key(str(path))} is damaged ({reason}); rebuilding "
          f"it", file=sys.stderr, flush=True)


def read_packed(path: Path, width: int, spec: str) -> tuple:
    """The arrays of the packed corpus at ``path`` (``Corpus``'s fields, in order), read
    whole and checked against sequences of ``width`` ids of tokenizer ``spec``
    (ValueError naming what does not hold: a cut file fails in numpy's own reading)."""
    with np.load(path, allow_pickle=False) as z:
        missing = {"train", "val", "train_doc", "titles", "genres"} - set(z.files)
        if missing:
            raise ValueError(f"no {sorted(missing)[0]!r} array")
        arrays = {name: z[name] for name in z.files}  # read now: a cut member fails here
    train, val, train_doc = arrays["train"], arrays["val"], arrays["train_doc"]
    titles, genres = arrays["titles"], arrays["genres"]
    lengths = arrays.get("token_bytes")
    if lengths is None:  # a byte corpus cached before BPE
        lengths = tok_lib.token_bytes(spec)
    dtype = tok_lib.token_dtype(spec)
    vocab = tok_lib.vocab_size(spec)

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(what)

    for name, a in (("train", train), ("val", val)):
        need(a.ndim == 2 and a.shape[1] == width and a.dtype == dtype,
             f"{name} is {a.dtype}{list(a.shape)}, not {np.dtype(dtype)}[n, {width}]")
        need(a.size == 0 or int(a.max()) < vocab, f"{name} holds ids past {vocab - 1}")
    need(len(val) > 0, "no validation sequence")
    need(titles.ndim == 1 and genres.shape == titles.shape and titles.dtype.kind == "U"
         and genres.dtype.kind == "U", "titles and genres are not one text per document")
    need(train_doc.shape == (len(train),) and train_doc.dtype.kind in "iu"
         and (train_doc.size == 0 or 0 <= int(train_doc.min())
              and int(train_doc.max()) < len(titles)),
         "train_doc does not name a document per training sequence")
    need(lengths.shape == (vocab,) and lengths.dtype.kind in "iu",
         f"token_bytes is not {vocab} byte counts")
    return train, val, train_doc, tuple(titles.tolist()), tuple(genres.tolist()), lengths


def tokenized(docs, split, kwargs: dict, path: Path):
    """``docs`` tokenized by ``split``, through ``datasets``' cache file at ``path``; a
    cache file that cannot be read is rebuilt (a folder there: tokenized in memory)."""
    found = state(path)
    if found == "not ours":
        return docs.map(split, batched=True, remove_columns=["text"], fn_kwargs=kwargs,
                        keep_in_memory=True, desc="tokenizing")
    fresh = found == "damaged"
    try:
        return docs.map(split, batched=True, remove_columns=["text"], fn_kwargs=kwargs,
                        cache_file_name=str(path), load_from_cache_file=not fresh,
                        desc="tokenizing")
    except Exception as exc:  # noqa: BLE001 - a damaged cache file, if it was read
        if fresh or not path.exists():
            raise
        damaged(path, why(exc))
    return docs.map(split, batched=True, remove_columns=["text"], fn_kwargs=kwargs,
                    cache_file_name=str(path), load_from_cache_file=False, desc="tokenizing")


def cached_bpe(path: Path, texts: Iterable[str], vocab: int) -> str:
    """The tokenizer JSON at ``path``, trained from ``texts`` and written there first if
    absent (atomically: concurrent processes never read half a file). A cached JSON that
    is not a byte-level BPE of ``vocab`` ids (cut short, edited) is said in one line and
    trained again in its place; a folder there is left alone (trained for this run)."""
    found = state(path)
    if found == "file":
        try:
            if path.stat().st_size > MAX_JSON:
                raise ValueError(f"larger than the {MAX_JSON >> 20} MiB of any tokenizer")
            return tok_lib.checked_bpe(path.read_text(encoding="utf-8"), vocab)
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            damaged(path, first_line(exc) or type(exc).__name__)
    text = tok_lib.train_bpe(texts, vocab)
    if found != "not ours":
        files.write_cache(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return text
