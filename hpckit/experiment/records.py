"""A checkpoint's file records, and the file of their own that holds them beyond a threshold.

A checkpoint of a thousand ranks with two files each has 2,000 records. Kept inline, every
later change of the manifest (the next commit, a validation, the end of an attempt) would
render and rewrite all of them again. Manifest format 5 moves the records of a checkpoint
of more files than ``HPCKIT_INLINE_RECORDS`` (1,000) into ``records/<index>.json``, written
once, before the commit, by the experiment's owner; the manifest keeps the file's name,
checksum and record count. A record file is never changed after it is written, and it is read back only
when its checksum matches the manifest's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from hpckit import settings
from hpckit.errors import ManifestError
from hpckit.storage.checksum import checksum_of
from hpckit.storage.checksum import problem as checksum_problem

RECORDS_DIR = "records"
RECORDS_FORMAT = "hpckit.records"


class FileRecord(NamedTuple):
    """One file of a checkpoint. A tuple, not a dataclass: a commit at 10,000 ranks makes,
    sends and renders tens of thousands of them, and a tuple is made and read back from a
    pickle several times faster."""

    path: str
    size: int
    rank: int | None  # that wrote it; None: one of several that handed an in-place directory
    checksum: str  # "<algorithm>:<hex>" (hpckit.storage.checksum)


@dataclass(frozen=True)
class RecordsFile:
    """Where a checkpoint's records are kept when the manifest does not hold them: the file
    (relative to the experiment), its checksum, and how many records it holds."""

    name: str
    checksum: str
    count: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.name, "checksum": self.checksum, "count": self.count}


def records_name(index: int) -> str:
    """The record file of checkpoint ``index``: indexes are never reused, so neither is it."""
    return f"{RECORDS_DIR}/{index:06d}.json"


def filed_apart(files: Sequence[FileRecord]) -> bool:
    """Whether a checkpoint's records go into a file of their own."""
    return len(files) > settings.current().inline_records


def render_records(directory: str, files: Sequence[FileRecord]) -> bytes:
    """A record file's bytes: one compact array per file, in the manifest's order."""
    body = {"format": RECORDS_FORMAT, "directory": directory, "files": files}
    return (json.dumps(body, separators=(",", ":"), allow_nan=False) + "\n").encode()


def filed(directory: str, index: int, files: Sequence[FileRecord]) -> tuple[RecordsFile, bytes]:
    """The reference a manifest keeps and the bytes to write for a checkpoint's records."""
    data = render_records(directory, files)
    return RecordsFile(records_name(index), checksum_of(data), len(files)), data


def parse_reference(raw: Any, index: int, where: str) -> RecordsFile:
    """A manifest's ``records`` field of checkpoint ``index``, checked: it can name only that
    checkpoint's record file."""
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest {where}: expected an object with file, checksum, count.")
    name, checksum, count = raw.get("file"), raw.get("checksum"), raw.get("count")
    if name != records_name(index):
        raise ManifestError(f"manifest {where}.file: {name!r} is not {records_name(index)!r}.")
    if not isinstance(checksum, str) or (why := checksum_problem(checksum)) is not None:
        raise ManifestError(f"manifest {where}.checksum: {checksum!r}: "
                            f"{why or 'expected a checksum'}.")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ManifestError(f"manifest {where}.count: expected a number of records.")
    return RecordsFile(name, checksum, count)


def read_records(reference: RecordsFile, read: Callable[[str], bytes], where: str,
                 is_safe: Callable[[str], bool]) -> tuple[FileRecord, ...]:
    """The records a record file holds, read through ``read`` (a name relative to the
    experiment) and refused unless they are exactly what the manifest names."""
    data = read(reference.name)
    if checksum_of(data) != reference.checksum:
        raise ManifestError(
            f"{reference.name} does not match the checksum that manifest {where} records (a "
            "damaged or replaced file); restore it from a backup. The other checkpoints are "
            "unaffected.")
    try:
        body = json.loads(data)
        entries = body["files"] if body.get("format") == RECORDS_FORMAT else None
    except (ValueError, UnicodeDecodeError, AttributeError, KeyError):
        entries = None
    if not isinstance(entries, list) or len(entries) != reference.count:
        raise ManifestError(f"{reference.name} of manifest {where} is not a record file of "
                            f"{reference.count} records.")
    return tuple(_record(entry, is_safe, f"{reference.name}: files[{i}]")
                 for i, entry in enumerate(entries))


def _record(entry: Any, is_safe: Callable[[str], bool], where: str) -> FileRecord:
    if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)
            and _is_int(entry[1]) and (entry[2] is None or _is_int(entry[2]))
            and isinstance(entry[3], str)):
        raise ManifestError(f"{where}: expected [path, size, rank, checksum].")
    path, size, rank, checksum = entry
    if not is_safe(path):
        raise ManifestError(f"{where}: {path!r} leaves the checkpoint directory.")
    if (why := checksum_problem(checksum)) is not None:
        raise ManifestError(f"{where}: {why}.")
    return FileRecord(path, size, rank, checksum)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
