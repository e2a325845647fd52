"""Read back what wandb itself recorded in an offline run's ``.wandb`` file (tests only).

wandb 0.31 writes an offline run as a LevelDB-style log of protobuf ``Record`` messages
(``wandb.proto.wandb_internal_pb2``): a 7-byte header (":W&B", magic 0xBEE1, version 0), then
32 KiB blocks of chunks, each with a CRC32, a length and a type (full, first, middle, last).
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> list[bytes]:
    if data[:4] != b":W&B":
        raise ValueError("not a wandb transaction log")
    out, pending, pos = [], b"", _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the rest of a block too short for a chunk header is padding
            pos += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 and length == 0:
            pos += left
            continue
        payload = data[pos + _HEADER : pos + _HEADER + length]
        if zlib.crc32(bytes([kind]) + payload) & 0xFFFFFFFF != checksum:
            raise ValueError(f"chunk at byte {pos} fails its CRC32")
        pos += _HEADER + length
        if kind == _FULL:
            out.append(payload)
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            out.append(pending + payload)
            pending = b""
    return out


def read_offline_run(run_file: Path) -> dict:
    """config, group, job_type, tags and summary of an offline run, as wandb recorded them."""
    from wandb.proto import wandb_internal_pb2 as pb

    run: dict = {"config": {}, "summary": {}, "history_keys": set()}
    for payload in _payloads(Path(run_file).read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(
                group=record.run.run_group,
                job_type=record.run.job_type,
                tags=list(record.run.tags),
                run_id=record.run.run_id,
            )
            for item in record.run.config.update:
                run["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                run["config"][item.key] = json.loads(item.value_json)
        elif kind == "summary":
            for item in record.summary.update:
                run["summary"][item.key or ".".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "history":
            run["history_keys"].update(item.key for item in record.history.item)
    return run
