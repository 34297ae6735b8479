"""Splitting the corpus's training sequences across workers (``data.partition``): iid,
whole documents per worker (by-play, balanced), or genre-skewed through flwr-datasets'
DirichletPartitioner. Deterministic in the seed. ``corpus`` is a ``fedlm.data.Corpus``
(not imported: the package imports this module)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedlm.config import DataConfig
from fedlm.errors import ConfigError


def partition(corpus: Any, cfg: DataConfig, num_workers: int, seed: int) -> list[np.ndarray]:
    """Indices into ``corpus.train`` for each worker; deterministic in ``seed``."""
    n = len(corpus.train)
    if cfg.partition == "iid":
        order = np.random.default_rng(seed).permutation(n)
        shards = np.array_split(order, num_workers)
    elif cfg.partition == "by-play":
        shards = _by_document(corpus, num_workers)
    else:
        shards = _dirichlet(corpus, cfg.alpha, num_workers, seed)
    for w, shard in enumerate(shards):
        if len(shard) == 0:
            raise ConfigError(
                f"data.partition: worker {w} gets no data with {cfg.partition!r} "
                f"over {num_workers} workers; use fewer workers or another partition")
    return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]


def _by_document(corpus: Any, num_workers: int) -> list[np.ndarray]:
    """Whole documents per worker, largest first to the lightest worker (balanced)."""
    n_docs = len(corpus.titles)
    if n_docs < num_workers:
        raise ConfigError(f"data.partition: 'by-play' needs at least as many documents "
                          f"({n_docs}) as workers, got {num_workers!r}")
    sizes = np.bincount(corpus.train_doc, minlength=n_docs)
    load = np.zeros(num_workers, dtype=np.int64)
    owner = np.empty(n_docs, dtype=np.int64)
    for d in sorted(range(n_docs), key=lambda d: (-sizes[d], d)):
        w = int(np.argmin(load))  # ties: the lowest worker index
        owner[d] = w
        load[w] += sizes[d]
    return [np.flatnonzero(owner[corpus.train_doc] == w) for w in range(num_workers)]


def _dirichlet(corpus: Any, alpha: float, num_workers: int, seed: int) -> list[np.ndarray]:
    """Genre-skewed shards through flwr-datasets' DirichletPartitioner."""
    import datasets  # here, not at the top: slow, and a config check imports this module
    from flwr_datasets.partitioner import DirichletPartitioner

    genres = np.asarray(corpus.genres)[corpus.train_doc]
    table = datasets.Dataset.from_dict({"genre": genres.tolist(),
                                        "index": np.arange(len(genres)).tolist()})
    part = DirichletPartitioner(num_partitions=num_workers, partition_by="genre",
                                alpha=alpha, min_partition_size=1, seed=seed,
                                shuffle=False)
    part.dataset = table
    # Read as one numpy slice each: np.asarray over a Dataset's column went row by row
    # (about 5 s of every dirichlet run's start, in every process that partitions)
    return [np.asarray(part.load_partition(w).with_format("numpy")[:]["index"],
                       dtype=np.int64) for w in range(num_workers)]
