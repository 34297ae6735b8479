"""Fault injection: what goes wrong in real fleets, on purpose and seeded.

The ``[faults]`` config section gives per-job probabilities. The *server*
draws each job's fault when it dispatches the job (from the faults seed, the
worker and the worker's job count, so a fault does not depend on the order
other jobs ran in) and sends it in the job message; the worker acts it out:

    crash      the ClientApp raises before training      -> an error reply
    hang       it never replies (on the wall clock it stalls ``hang_seconds``
               and then dies; on the virtual clock the engine's deadline fires)
    nan        the update holds NaN and Inf                -> rejected at the boundary
    bad_shape  one tensor has a wrong shape                -> rejected
    bad_dtype  one tensor is float64                       -> rejected
    bad_size   one tensor is missing                       -> rejected
    duplicate  the reply is delivered twice (the network)  -> the second is ignored

and, drawn separately after each job, ``offline``: the worker is unavailable
for ``offline_seconds``. The same draws happen in simulation and deployment;
the engine logs every injected fault and its outcome as events.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from fedlm.config import FAULT_KINDS, Config
from fedlm.errors import ConfigError, shown


class InjectedFault(RuntimeError):
    """Raised inside a worker to act out an injected crash or hang."""


def _uniform(cfg: Config, worker: int, job_index: int, stream: int) -> float:
    seed = cfg.faults.seed if cfg.faults.seed >= 0 else cfg.seed
    ss = np.random.SeedSequence([seed, 6700417, stream, worker, job_index])
    return float(np.random.default_rng(ss).random())


def _applies(cfg: Config, worker: int) -> bool:
    return not cfg.faults.workers or worker in cfg.faults.workers


def draw(cfg: Config, worker: int, job_index: int) -> str:
    """The fault of ``worker``'s ``job_index``-th job: a kind of FAULT_KINDS or ""."""
    if not _applies(cfg, worker) or not any(getattr(cfg.faults, k) for k in FAULT_KINDS):
        return ""  # no draw when no fault can strike: a sixth of the engine's time per job
    u = _uniform(cfg, worker, job_index, 0)
    acc = 0.0
    for kind in FAULT_KINDS:
        acc += getattr(cfg.faults, kind)
        if u < acc:
            return kind
    return ""


def goes_offline(cfg: Config, worker: int, job_index: int) -> bool:
    """Whether ``worker`` goes offline after its ``job_index``-th job."""
    return (cfg.faults.offline > 0 and _applies(cfg, worker)
            and _uniform(cfg, worker, job_index, 1) < cfg.faults.offline)


def before_job(fault: str, cfg: Config) -> None:
    """Act out a fault that strikes before training (crash, hang)."""
    if fault == "crash":
        raise InjectedFault("injected crash")
    if fault == "hang":
        if cfg.clock == "wall":
            time.sleep(cfg.faults.hang_seconds)  # a stalled worker, not a synchronisation
        raise InjectedFault("injected hang: the worker never replied")


def corrupt(grad: OrderedDict, fault: str) -> OrderedDict:
    """The payload a faulty worker sends instead of ``grad`` (its encoded update)."""
    if fault not in ("nan", "bad_shape", "bad_dtype", "bad_size"):
        return grad
    out = OrderedDict((k, v.clone()) for k, v in grad.items())
    name = next(iter(out))
    if fault == "nan":
        # the first floating-point tensor (with int8/int4 payloads: a scale)
        name = next(k for k, v in out.items() if v.is_floating_point())
        flat = out[name].view(-1)
        flat[0] = float("nan")
        flat[-1] = float("inf")
    elif fault == "bad_shape":
        out[name] = out[name].reshape(-1)[:-1].clone()
    elif fault == "bad_dtype":
        out[name] = out[name].double()
    else:
        del out[name]
    return out


class DuplicatingTransport:
    """Wraps a transport: replies of jobs whose fault is ``duplicate`` arrive twice."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.duplicate: set[int] = set()

    def submit(self, job, params) -> None:
        if job.fault == "duplicate":
            self.duplicate.add(job.job_id)
        self.inner.submit(job, params)

    def collect(self, timeout: float):
        out = []
        for reply in self.inner.collect(timeout):
            out.append(reply)
            if reply.job_id in self.duplicate:
                self.duplicate.discard(reply.job_id)
                out.append(reply)
        return out


def check_config(cfg: Config) -> None:
    """The ``[faults]`` section's values, each refused in one line naming it."""
    fa = cfg.faults
    for name in (*FAULT_KINDS, "offline"):
        p = getattr(fa, name)
        _require(0 <= p <= 1, f"faults.{name}", p, "must be a probability in [0, 1]")
    total = sum(getattr(fa, n) for n in FAULT_KINDS)
    _require(total <= 1, "faults", total, "per-job fault probabilities must sum to <= 1")
    _require(0 < fa.offline_seconds < float("inf"), "faults.offline_seconds",
             fa.offline_seconds, "must be > 0 and finite")
    _require(0 <= fa.hang_seconds < float("inf"), "faults.hang_seconds", fa.hang_seconds,
             "must be >= 0 and finite")
    for k, w in enumerate(fa.workers):
        _require(0 <= w < cfg.workers, f"faults.workers[{k}]", w, "must be a worker index")


def _require(ok: bool, path: str, value, why: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {why}, got {shown(value)}")
