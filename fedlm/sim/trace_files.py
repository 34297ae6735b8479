"""Reading a trace file (``read_trace``): JSON, or a pickle read by an unpickler that
builds no class at all and refuses a container referred to twice (FedScale's traces
hold only dicts, lists, numbers and strings; a pickle naming a class could run any
code, and shared containers make a few hundred bytes take exponential time to walk).
A refusal is one ``ConfigError`` line naming the file."""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path
from typing import Any

from fedlm import files
from fedlm.errors import ConfigError, shown, shown_key


class _NeedsClass(pickle.UnpicklingError):
    """A pickle that asks for a class (its message: which)."""


class _SharedContainer(pickle.UnpicklingError):
    """A pickle that refers to one list, dict or tuple twice."""


MAX_DEPTH = 8  # a trace is a dict of clients' dicts of lists of numbers: depth 3
MAX_ID = 300  # characters of a client id (FedScale's are small integers)


class _PlainUnpickler(pickle._Unpickler):  # the Python one: its memo reads can be checked
    """Builds dicts, lists, tuples, numbers and strings only: every class is refused, and
    so is a second reference to a container. A trace never shares one (a dict per
    client, a list per window kind), and sharing is how a few hundred bytes become a
    structure whose every walk (hashing a key, validating, printing) takes exponential
    time; strings and numbers may be shared (pickle shares repeated keys)."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        raise _NeedsClass(shown(f"{module}.{name}", 80))

    def _push_memo(self, index: int) -> None:
        try:
            obj = self.memo[index]
        except KeyError:
            raise pickle.UnpicklingError(f"memo value {index} not found") from None
        if isinstance(obj, (list, dict, tuple, set, frozenset)) and obj:
            raise _SharedContainer("a container referred to twice")
        self.append(obj)

    def _get(self) -> None:
        self._push_memo(int(self.readline()[:-1]))

    def _binget(self) -> None:
        self._push_memo(self.read(1)[0])

    def _long_binget(self) -> None:
        self._push_memo(int.from_bytes(self.read(4), "little"))

    dispatch[pickle.GET[0]] = _get
    dispatch[pickle.BINGET[0]] = _binget
    dispatch[pickle.LONG_BINGET[0]] = _long_binget


def _depth(value: Any) -> int:
    """How deeply containers nest in ``value`` (iteratively: no recursion limit met)."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in (*v.keys(), *v.values()))
        elif isinstance(v, (list, tuple)):
            stack.extend((x, d + 1) for x in v)
    return deepest


_NOT_JSON = object()


class _Twice(Exception):
    """A JSON object with a key twice (not a ValueError: json.loads would hide it)."""


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Twice(k)
        out[k] = v
    return out


def read_trace(path: str | Path) -> dict[str, Any]:
    """A JSON or pickle trace file's dict, its client ids as strings, in key order
    (ids that are integers numerically and first, the others as strings)."""
    where = shown_key(str(path))
    try:
        data = files.read_bytes(path, "trace")  # a FIFO, /dev/zero, a huge file: refused
    except files.FileRefused as exc:
        raise ConfigError(str(exc)) from None
    raw: Any = _NOT_JSON
    not_json = None  # why JSON could not read it
    if not data.startswith(b"\x80"):  # not a pickle of protocol 2 or later: JSON?
        try:
            raw = json.loads(data, object_pairs_hook=_once_each)
        except _Twice as exc:  # JSON would keep the last of them: silently another fleet
            raise ConfigError(f"{where}: {shown(exc.args[0], 60)} appears twice in one "
                              f"JSON object (a JSON reader keeps the last one)") from None
        except (ValueError, RecursionError) as exc:
            not_json = exc
    if raw is _NOT_JSON and not_json is not None and data.lstrip()[:1] in (b"{", b"["):
        raise ConfigError(f"{where}: not valid JSON ({_json_why(not_json)})")
    if raw is _NOT_JSON:
        try:
            raw = _PlainUnpickler(io.BytesIO(data)).load()
        except _NeedsClass as exc:
            raise ConfigError(f"{where}: not a plain FedScale trace: the pickle asks for "
                              f"{exc} (a trace holds only dicts, lists, numbers and "
                              f"strings, never a class)") from None
        except _SharedContainer:
            raise ConfigError(f"{where}: not a plain FedScale trace: the pickle refers to "
                              f"one list, dict or tuple twice") from None
        except Exception:  # noqa: BLE001 - any malformed pickle is the same refusal
            raise ConfigError(f"{where}: neither JSON nor a pickle") from None
    if _depth(raw) > MAX_DEPTH:
        raise ConfigError(f"{where}: not a plain FedScale trace: nested more than "
                          f"{MAX_DEPTH} deep (a trace is a dict of clients' dicts of lists)")
    if not isinstance(raw, dict) or not raw:
        what = "no clients" if isinstance(raw, dict) else f"a {type(raw).__name__}"
        raise ConfigError(f"{where}: holds {what}, not a dict of clients")
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if isinstance(k, bool) or not isinstance(k, (int, str)):
            raise ConfigError(f"{where}: client id {shown(k, 60)} is not an integer or a "
                              f"string")
        if len(k) > MAX_ID if isinstance(k, str) else abs(k) >= 10**MAX_ID:
            size = (f"is {len(k):,} characters long" if isinstance(k, str)
                    else f"has more than {MAX_ID} digits")
            raise ConfigError(f"{where}: client id {shown(k, 40)} {size}; fedlm reads ids "
                              f"of at most {MAX_ID} characters")
        if str(k) in out:
            raise ConfigError(f"{where}: client id {shown(k, 60)} appears twice")
        out[str(k)] = v
    order = [(0, int(k), "") if re.fullmatch(r"-?[0-9]+", k) else (1, 0, k) for k in out]
    return {k: out[k] for _, k in sorted(zip(order, out))}


def _json_why(exc: BaseException) -> str:
    """JSON's complaint, in one short line (not Python's advice on long integers)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "integer string conversion" in text:
        return "a number of more than 4300 digits"
    if isinstance(exc, RecursionError):
        return "nested too deep"
    return text[:120]
