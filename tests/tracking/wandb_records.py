"""Read a wandb offline run file (`run-<id>.wandb`): wandb 0.31 has no Python reader for it (its
reader lives in the Go core), so this follows its format: a 7-byte header (`:W&B`, a magic
number, a version), then LevelDB's log format (32 KiB blocks of chunks: CRC-32C, length, type)
carrying `wandb_internal_pb2.Record` messages."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def payloads(data: bytes) -> list[bytes]:
    """The log's records, chunks joined, from `data` after the file header."""
    found, partial, offset = [], b"", 0
    while offset + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - (offset + 7) % BLOCK  # blocks count from the file's start
        if left_in_block < CHUNK_HEADER:
            offset += left_in_block
            continue
        length, kind = struct.unpack_from("<HB", data, offset + 4)
        chunk = data[offset + CHUNK_HEADER : offset + CHUNK_HEADER + length]
        offset += CHUNK_HEADER + length
        if kind in (FULL, FIRST):
            partial = chunk
        elif kind in (MIDDLE, LAST):
            partial += chunk
        if kind in (FULL, LAST):
            found.append(partial)
    return found


def read_run(path: Path) -> dict:
    """The run id, its config keys and its history rows (`_step` and the logged keys)."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = path.read_bytes()
    assert raw[:4] == b":W&B", f"{path} is not a wandb run file"
    run = {"id": None, "config": {}, "history": []}
    for payload in payloads(raw[7:]):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["id"] = record.run.run_id
            run["config"].update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        elif kind == "history":
            run["history"].append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return run
