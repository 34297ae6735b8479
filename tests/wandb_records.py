"""Reading a W&B offline run file (``run-<id>.wandb``) back, for the tracker tests.

The file is W&B's 7-byte header (``:W&B``, magic 0xBEE1, version 0) and then
LevelDB's log format: 32 KiB blocks of records, each with a 7-byte header
(CRC32C, little-endian length, type: 1 full, 2 first, 3 middle, 4 last) and,
whole, one protobuf ``Record`` of ``wandb_internal.proto``. The wandb package no
longer ships a Python reader of it, hence this one.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def raw_records(path: str | Path) -> list[bytes]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B" and data[4:6] == b"\xe1\xbe", "not a W&B run file"
    records, pending, pos = [], b"", _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if kind == 0 and length == 0:  # zeros: the end of what was written
            break
        chunk = data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            records.append(pending + chunk)
            pending = b""
    return records


def read_run(path: str | Path) -> dict:
    """The run's name and group, its config, and its history rows (step -> values)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out: dict = {"config": {}, "history": {}, "name": None, "group": None, "exit_code": None}
    for raw in raw_records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["name"], out["group"] = record.run.display_name, record.run.run_group
            for item in record.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                   for item in record.history.item}
            step = record.history.step.num if record.history.HasField("step") else row["_step"]
            out["history"].setdefault(step, {}).update(row)
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
    return out
