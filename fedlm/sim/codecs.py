"""Codecs of your own for outer gradients: ``network.compression = "package.module:Codec"``.

The built-in encodings (fp32, bf16, fp16, int8, int4) live in ``fedlm.sim.compression``
and their sizes in ``fedlm.sim.wire_sizes``; both hand a name with a colon to the codec
it loads here. A codec is a class, made once per process with no arguments, with:

    encode(grad, state, net) -> (payload, errors)
        grad: the outer gradient, name -> fp32 tensor (all of the model, or one
        fragment of it with Streaming DiLoCo); state: the worker's state, which holds
        the ``errors`` this codec returned for the worker's last accepted job; net: the
        run's NetworkConfig. payload: name -> tensor, what goes on the wire (any
        dtype: a message carries the tensors' own bytes, fedlm.flower.messages); errors:
        name -> tensor kept on the worker for its next job, each name starting with
        ``EF_PREFIX`` ("ef/"): error feedback lives with the worker's optimizer state,
        addressed by job like the int8/int4 codecs' (a rejected or lost job leaves none)
    decode(payload, reference, net) -> grad
        fp32 tensors named and shaped like ``reference``; raise
        ``fedlm.params.BadUpdate`` for a payload that cannot be one (it is refused
        like a NaN); what comes out is checked as every update is
    payload_bytes(reference, net) -> int
        the bytes ``encode`` sends for an update shaped like ``reference``: the virtual
        clock times uploads by it and the run store counts it, as it does the built-in
        encodings' ``wire_sizes.encoded_bytes`` (so it must not depend on the values)

Settings of a codec are its class attributes (a subclass changes them). The planner
(``fedlm plan``) knows the built-in encodings only. Torch-free until a codec is loaded.
"""

from __future__ import annotations

from typing import Any

from fedlm.config import COMPRESSIONS
from fedlm.errors import ConfigError, shown

EF_PREFIX = "ef/"  # the worker's error-feedback tensors (shared with fedlm.sim.compression)
METHODS = ("encode", "decode", "payload_bytes")
_LOADED: dict[str, Any] = {}  # path -> the codec instance (one per process)


def is_plugin(name: str) -> bool:
    """Whether ``network.compression`` names a codec by dotted path."""
    return ":" in name


def check(name: str) -> None:
    """A built-in encoding or a loadable codec; else one line naming the setting."""
    if not is_plugin(name):
        if name not in COMPRESSIONS:
            raise ConfigError(f"network.compression: must be {', '.join(COMPRESSIONS)} or "
                              f"package.module:Codec, got {shown(name)}")
        return
    codec(name)


def codec(name: str):
    """The codec ``name`` loads, made once per process."""
    if name not in _LOADED:
        from fedlm.strategies.registry import load_dotted

        try:
            cls = load_dotted(name, "network.compression")
        except ConfigError:
            raise
        except (ValueError, TypeError):  # not a module name at all (":x")
            raise ConfigError(f"network.compression: not a package.module:Codec, "
                              f"got {shown(name)}") from None
        missing = [m for m in METHODS if not callable(getattr(cls, m, None))]
        if not isinstance(cls, type) or missing:
            raise ConfigError(f"network.compression: {name!r} is not a codec class (it needs "
                              f"{', '.join(missing or METHODS)})")
        _LOADED[name] = cls()
    return _LOADED[name]


def encode(grad, state: dict, net) -> tuple[Any, dict]:
    """The codec's payload and error-feedback tensors, each error named ``ef/...``."""
    payload, errors = codec(net.compression).encode(grad, state, net)
    stray = [k for k in errors if not k.startswith(EF_PREFIX)]
    if stray:
        raise ValueError(f"network.compression: {net.compression!r} returned errors named "
                         f"{stray[:3]}: error-feedback tensors must be named {EF_PREFIX}...")
    return payload, errors


def decode(payload, reference, net):
    return codec(net.compression).decode(payload, reference, net)


def payload_bytes(reference, net) -> int:
    """The codec's bytes for an update like ``reference``, checked as a typed quantity
    is: a whole number of bytes in ``quantities.PAYLOAD`` (a negative, NaN, or
    petabytes-large size would time transfers as nonsense, or for ever)."""
    from fedlm.sim import quantities as Q

    said = codec(net.compression).payload_bytes(reference, net)
    try:
        ok = not isinstance(said, bool) and Q.PAYLOAD.ok(float(said))
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ConfigError(f"network.compression: {net.compression}'s payload_bytes gave "
                          f"{shown(said, 60)}; it must be {Q.PAYLOAD.rule()}")
    return int(said)


def probe(cfg) -> None:
    """Ask a codec of one's own for its bytes of the run's model before the run is stored
    (bounded as its hooks are), so that a size it cannot give (negative, NaN, a string,
    petabytes) is refused in one line now, not once the run has started."""
    if not is_plugin(cfg.network.compression):
        return
    from fedlm import data, model as model_lib
    from fedlm.servers.watch import bounded, plug_in_bound

    net = model_lib.blank(cfg.model, cfg.data.seq_len, vocab_size=data.vocab_size(cfg.data))
    reference = {name: p.detach() for name, p in net.named_parameters()}
    try:
        bounded(plug_in_bound(cfg), f"network.compression {cfg.network.compression}'s "
                f"payload_bytes", payload_bytes, reference, cfg.network)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the codec raises: its one line
        raise ConfigError(f"network.compression: {cfg.network.compression}'s payload_bytes "
                          f"failed on the {cfg.model!r} model: {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:200]}") from None
