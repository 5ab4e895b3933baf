"""W&B's offline run files read back (``wandb/offline-run-*/run-ID.wandb``), for the tests:
wandb 0.31 has no reader of its own. A file is a log of ``wandb_internal_pb2.Record``s in
LevelDB's format: 32 KiB blocks of chunks, each with its CRC-32, its length and whether it
holds a whole record or its first, middle or last part."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = struct.Struct("<IHB")  # crc32, length, chunk type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0), f"{path} is no W&B run file"
    position, pending = 7, b""
    while position + HEADER.size <= len(data):
        if BLOCK - position % BLOCK < HEADER.size:  # the block's padding
            position += BLOCK - position % BLOCK
            continue
        crc, length, kind = HEADER.unpack_from(data, position)
        if kind == 0 and length == 0:
            break
        chunk = data[position + HEADER.size:position + HEADER.size + length]
        position += HEADER.size + length
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, path
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def offline_runs(directory: Path) -> list[dict[str, Any]]:
    """Each offline run under ``directory`` (oldest first): its id, its history rows and
    its exit code (None: it never finished)."""
    found = []
    for path in sorted(directory.glob("wandb/offline-run-*/run-*.wandb")):
        run: dict[str, Any] = {"id": None, "history": [], "exit_code": None}
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"] = record.run.run_id
            elif kind == "history":
                run["history"].append({"/".join(item.nested_key) or item.key:
                                       json.loads(item.value_json) for item in record.history.item})
            elif kind == "exit":
                run["exit_code"] = record.exit.exit_code
        found.append(run)
    return found
