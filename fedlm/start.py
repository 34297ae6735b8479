"""Where a run's federated phase starts (the ``[init]`` section).

    seeded model ──(init.from: another run's or a file's weights)──►
                 ──(init.pretrain_steps = K: K steps of one worker on all the
                    training data, synchronous, no federated method)──► start

The delayed-Nesterov paper starts its asynchronous phase from a model
pretrained for 24,000 of 88,000 steps; from a random start the first outer
gradients are large and every method's staleness costs most exactly then.

Both steps are deterministic, so they are part of the run's record: the store
keeps the hash of the seeded model (``initial_hash``) and of the start
(``start_hash``), and ``fedlm replay`` recomputes the start and checks it.
Pretrained weights are cached on disk under ``fedlm.data.cache_dir()``, keyed by
everything they depend on, so the arms of a sweep pretrain once; replay never
reads the cache.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from fedlm import checkpoint as ckpt_lib, data, files, model as model_lib
from fedlm.config import Config
from fedlm.errors import ConfigError, first_line
from fedlm.params import params_hash
from fedlm.model import load_into, snapshot
from fedlm.store import run_row, shown_status
from fedlm.worker.train import adamw, inner_lr, train_steps

PRETRAIN_VERSION = "pretrain-v1"  # bump when pretraining changes what it computes


@dataclass(frozen=True)
class Start:
    params: dict  # the weights the federated phase starts from
    initial_hash: str  # of the seeded model
    notes: tuple[tuple[str, str], ...]  # (event kind, detail) for the run's log


def initial(cfg: Config):
    """The seeded model's weights (what every run builds first)."""
    return snapshot(model_lib.build(cfg.model, cfg.data.seq_len, seed=cfg.seed,
                                    vocab_size=data.vocab_size(cfg.data)))


def resolve(cfg: Config, db_path: str | Path) -> tuple[dict, str, str]:
    """The weights before pretraining: the seeded model's, or ``init.from``'s.
    Returns ``(params, initial hash, what they are)``; ``ConfigError`` (one line)
    for a reference that cannot be used. Cheap: called before the run is stored."""
    params = initial(cfg)
    first = params_hash(params)
    if not cfg.init.from_:
        return params, first, ""
    loaded, what = load_weights(cfg.init.from_, db_path)
    return _fitted(loaded, params, what, cfg.model), first, what


def starting_point(cfg: Config, db_path: str | Path, *, use_cache: bool = True,
                   progress: Callable[[int, int], None] | None = None,
                   resolved: tuple[dict, str, str] | None = None) -> Start:
    """``resolve`` (or what it returned: ``resolved``), then pretraining if asked for."""
    params, first, what = resolved or resolve(cfg, db_path)
    notes = []
    if what:
        notes.append(("initialised", f"from {what} ({params_hash(params)[:12]})"))
    k = cfg.init.pretrain_steps
    if k:
        t0 = time.perf_counter()
        cache = _cache_path(cfg, params) if use_cache else None
        cached = _read_cache(cache) if cache is not None else None
        if cached is not None:
            params, how = cached, "cached"
        else:
            params, how = pretrain(params, cfg, progress=progress), "computed"
            if cache is not None:
                ckpt_lib.write(cache, {"params": params, "hash": params_hash(params)})
        notes.append(("pretrained", f"{k} steps of one worker on all training data "
                                    f"({how} in {time.perf_counter() - t0:.1f} s; "
                                    f"{params_hash(params)[:12]})"))
    return Start(params, first, tuple(notes))


def pretrain(params, cfg: Config, progress: Callable[[int, int], None] | None = None):
    """``init.pretrain_steps`` AdamW steps of one worker (inner hyperparameters,
    warmup then cosine over the K steps) on batches drawn from all the training data.
    AdamW whatever ``inner.optimizer`` names: the start belongs to the run's setting,
    not to its method, so arms that differ in their inner optimizer (MuLoCo's Muon)
    start from the same weights."""
    torch.set_num_threads(cfg.inner.threads)
    k = cfg.init.pretrain_steps
    net = model_lib.blank(cfg.model, cfg.data.seq_len,
                          device=model_lib.resolve_device(cfg.device),
                          vocab_size=data.vocab_size(cfg.data))
    load_into(net, params)  # every weight: the structure alone was needed
    opt = adamw(net, cfg)
    everything = np.arange(len(data.load_corpus(cfg.data).train), dtype=np.int64)
    seed = int(np.random.SeedSequence([cfg.seed, 86028121]).generate_state(1)[0])
    batches = data.job_batches(everything, k, cfg.inner.batch_size, seed)
    chunk = max(1, k // 20)  # report progress about 20 times
    for start in range(0, k, chunk):
        rows = batches[start:start + chunk]
        train_steps(net, opt, rows, lambda s, a=start: inner_lr(a + s, cfg.inner, k), cfg)
        if progress:
            progress(start + len(rows), k)
    return snapshot(net)


# -- init.from ------------------------------------------------------------------

def load_weights(ref: str, db_path: str | Path) -> tuple[dict, str]:
    """The weights ``ref`` names: ``RUN_ID`` (a finished run of ``db_path``),
    ``DB:RUN_ID``, or a file (fedlm weights, a fedlm checkpoint, or a plain
    ``torch.save``d state dict). Returns ``(params, description)``."""
    text = ref.strip()
    head, _, tail = text.rpartition(":")
    if text.isdigit():
        return _run_weights(Path(db_path), int(text))
    if head and tail.isdigit() and not Path(text).exists():
        return _run_weights(Path(head), int(tail))
    return _file_weights(Path(text))


def _run_weights(db: Path, run_id: int) -> tuple[dict, str]:
    what = f"run {run_id} of {db}"
    try:
        run = run_row(db, run_id)
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"init.from: cannot read {db}: {exc}") from None
    if run is None:
        raise ConfigError(f"init.from: there is no run {run_id} in {db}")
    if run["status"] != "finished":
        raise ConfigError(f"init.from: {what} is {shown_status(run)}; only a finished run's "
                          f"weights can be started from")
    path = ckpt_lib.weights_for(db, run_id)
    if not path.exists():
        raise ConfigError(f"init.from: {what} kept no final weights ({path} is missing; "
                          f"reliability.keep_weights was off, or they were deleted)")
    params, _ = _file_weights(path)  # damaged, truncated, foreign: one line, not a traceback
    if params_hash(params) != run["final_hash"]:
        raise ConfigError(f"init.from: {path} does not hold {what}'s final weights "
                          f"(hash differs from the run's)")
    return params, what


def _file_weights(path: Path) -> tuple[dict, str]:
    if not path.exists():
        raise ConfigError(f"init.from: no run id, DB:RUN_ID or file {str(path)!r}")
    try:
        blob = files.read_bytes(path, "checkpoint")  # a FIFO, a device, a huge file: refused
    except files.FileRefused as exc:
        raise ConfigError(f"init.from: {exc}") from None
    try:
        if blob.startswith(ckpt_lib.MAGIC):  # fedlm's format: a checkpoint or weights
            payload = ckpt_lib.read(path)
        else:  # a plain state dict (torch.save), tensors only
            payload = {"params": ckpt_lib.load_tensors(blob)}
    except ValueError as exc:
        raise ConfigError(f"init.from: {path}: {first_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - whatever else torch makes of foreign bytes
        raise ConfigError(f"init.from: {path} holds no weights fedlm can read "
                          f"({type(exc).__name__})") from None
    params = payload.get("params")
    if params is None:  # a run's checkpoint: the global params are in the engine's state,
        # under "model" ("driver" before that was renamed; its top before the engine split)
        engine = payload.get("engine") or {}
        part = engine.get("model") or engine.get("driver") or engine
        params = part.get("params") if isinstance(part, dict) else None
    if not isinstance(params, dict):
        raise ConfigError(f"init.from: {path} holds no weights fedlm can read")
    return params, str(path)


def _fitted(loaded, params, what: str, preset: str):
    """``loaded`` as the model's parameters (extra entries, e.g. buffers, dropped);
    ``ConfigError`` if a parameter is missing or of another shape."""
    wrong = [n for n in params if n not in loaded
             or tuple(loaded[n].shape) != tuple(params[n].shape)]
    if wrong:
        raise ConfigError(f"init.from: the weights of {what} do not fit the {preset!r} model "
                          f"({len(wrong)} tensors missing or of another shape, first "
                          f"{wrong[0]!r})")
    return OrderedDict((n, loaded[n].detach().to(dtype=params[n].dtype, device="cpu"))
                       for n in params)


# -- the pretraining cache --------------------------------------------------------

def _cache_path(cfg: Config, params) -> Path:
    """Cache file for pretraining ``params`` under ``cfg``: keyed by all it depends on."""
    inner = {k: v for k, v in cfg.to_dict()["inner"].items()
             if k not in ("steps", "decay_steps", "schedule", "state_store")}
    inner["optimizer"] = "adamw"  # what pretraining uses, whatever the run's is
    d = cfg.to_dict()["data"]
    if d["tokenizer"] == "byte":  # keep the key byte runs had before tokenizers were a setting
        del d["tokenizer"]
    key = json.dumps({"v": PRETRAIN_VERSION, "torch": torch.__version__, "model": cfg.model,
                      "device": model_lib.resolve_device(cfg.device), "seed": cfg.seed,
                      "steps": cfg.init.pretrain_steps, "inner": inner,
                      "data": {k: v for k, v in d.items()
                               if k not in ("partition", "alpha", "shards", "shard_choice")},
                      "start": params_hash(params)}, sort_keys=True)
    return data.cache_dir() / f"pretrain-{hashlib.sha256(key.encode()).hexdigest()[:20]}.pt"


def _read_cache(path: Path):
    if not path.exists():
        return None
    try:
        payload = ckpt_lib.read(path)
    except (OSError, ValueError, RuntimeError, EOFError):
        return None  # a damaged cache file is recomputed (and overwritten)
    params = payload["params"]
    return params if params_hash(params) == payload.get("hash") else None
