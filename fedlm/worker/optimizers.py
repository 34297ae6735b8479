"""The inner loop's optimizer by name (``inner.optimizer``): AdamW, or a factory of
your own loaded by dotted path.

    "adamw"               torch's AdamW on the [inner] settings (lr, betas, weight decay;
                          fused on CUDA): fedlm's inner optimizer, bit for bit as ever
    "package.module:name" name(parameters, inner) -> torch.optim.Optimizer, where
                          ``parameters`` is the model's (name, parameter) pairs in the
                          model's order (any torch optimizer takes them as they are) and
                          ``inner`` the run's ``InnerConfig``

What the inner loop does with either: before every step it sets each param group's
``lr`` to the warmup + cosine schedule's value (a group that wants another scale keeps
its own factor and applies it in ``step``), clips the gradient norm to
``inner.grad_clip``, and after the job keeps ``optimizer.state_dict()["state"]`` by
parameter name (``fedlm.worker.train``): every state entry must be a tensor, and the
same parameters must get the same state keys in the next job's optimizer, which the
factory builds afresh. Built once per job, so the factory is called once per job.

Torch-free until a factory is called: the config check asks ``check`` without torch.
"""

from __future__ import annotations

from typing import Any, Callable

from fedlm.errors import ConfigError, shown

BUILT_IN = ("adamw",)


def check(name: str) -> None:
    """Refuse, in one line, a name that is neither built in nor a loadable callable."""
    factory(name)


def factory(name: str) -> Callable[..., Any] | None:
    """The callable ``name`` loads (None for a built-in optimizer)."""
    if name in BUILT_IN:
        return None
    if ":" not in name:
        raise ConfigError(f"inner.optimizer: must be {' or '.join(BUILT_IN)} or "
                          f"package.module:name, got {shown(name)}")
    from fedlm.strategies.registry import load_dotted

    try:
        made = load_dotted(name, "inner.optimizer")
    except ConfigError:
        raise
    except (ValueError, TypeError):  # not a module name at all (":x")
        raise ConfigError(f"inner.optimizer: not a package.module:name, got {shown(name)}") \
            from None
    if not callable(made):
        raise ConfigError(f"inner.optimizer: {name!r} is not callable (a factory "
                          f"(parameters, inner) -> torch.optim.Optimizer)")
    return made


def build(name: str, named_parameters, inner):
    """The optimizer factory ``name`` makes for ``named_parameters`` (a list of
    (name, parameter) pairs); one line if it is not a ``torch.optim.Optimizer``."""
    import torch

    opt = factory(name)(named_parameters, inner)
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"inner.optimizer: {name!r} returned {type(opt).__name__}, "
                        f"not a torch.optim.Optimizer")
    return opt


def state_names(opt, net) -> list[str]:
    """The parameter name of each index of ``opt.state_dict()["state"]``: torch numbers
    parameters group after group, in each group's order, so an optimizer that splits the
    model into groups (Muon's matrices, AdamW's rest) numbers them out of the model's
    order. One group of every parameter in order (AdamW): the model's names as they are."""
    by_id = {id(p): n for n, p in net.named_parameters()}
    return [by_id[id(p)] for group in opt.param_groups for p in group["params"]]


def probe(cfg) -> None:
    """Build ``inner.optimizer`` once for the run's model before the run is stored, so
    that a factory that raises or returns something else is refused in one line now,
    not as three failed jobs of every worker later."""
    if cfg.inner.optimizer in BUILT_IN:
        return
    from fedlm import data, model as model_lib

    from fedlm.servers.watch import bounded, plug_in_bound

    net = model_lib.blank(cfg.model, cfg.data.seq_len, vocab_size=data.vocab_size(cfg.data))
    try:  # bounded as every plug-in's code is: a factory that sleeps ends in one line
        bounded(plug_in_bound(cfg), f"inner.optimizer {cfg.inner.optimizer}", build,
                cfg.inner.optimizer, list(net.named_parameters()), cfg.inner)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the factory raises: its one line
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(text if text.startswith("inner.optimizer") else
                          f"inner.optimizer: {cfg.inner.optimizer} failed on the "
                          f"{cfg.model!r} model: {type(exc).__name__}: {text}") from None
