"""Reading experiments without changing them: manifests, metrics logs, a root's experiments.

Anyone may read; only :class:`hpckit.experiment.Experiment` writes.

``metrics.jsonl`` where storage cannot append (object stores): a log in segments.

An object cannot be appended to, only replaced, so a log kept as one object would be rewritten
whole at every report: O(reports²) bytes over a run, and the whole log in rank 0's memory.
There, the log is cut into segments of :data:`SEGMENT_LINES` lines: ``metrics.jsonl`` holds
the first, ``metrics.000001.jsonl`` the next, and so on. A report replaces only the last
segment (at most a segment's bytes), and a full segment is never written again. Readers read
them in order (:func:`read_log`). On a filesystem, ``metrics.jsonl`` is appended to and is the
whole log.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import pyarrow.fs

from hpckit.errors import ManifestError, StorageError
from hpckit.experiment import encoding
from hpckit.experiment.manifest import MANIFEST_NAME, METRICS_NAME, Manifest, is_safe_relpath
from hpckit.experiment.records import KeptApart, RecordsFile
from hpckit.storage import files
from hpckit.storage.location import Location

_FT = pyarrow.fs.FileType
# pyarrow reads an object with a HEAD for its size, then GETs: replaced in between by a run
# that commits, the manifest reads cut at the old size. Read again before calling it damaged.
TORN_READ_WAITS = (0.05, 0.2)


def read_manifest(experiment: Location) -> Manifest | None:
    """The experiment's manifest, None when there is none; a damaged one raises ManifestError."""
    location = experiment.join(MANIFEST_NAME)
    kind = files.file_type(location)
    if kind == _FT.NotFound:
        return None
    if kind != _FT.File:
        raise StorageError(f"{location.display} is not a file; move it aside and run again.")
    read = functools.partial(_read_relative, experiment)  # a value: pickled with the manifest
    for wait in TORN_READ_WAITS:
        try:
            return encoding.from_json(files.read_bytes(location), location.display, read)
        except ManifestError:
            time.sleep(wait)
    return encoding.from_json(files.read_bytes(location), location.display, read)


def records_of(experiment: Location, reference: RecordsFile) -> KeptApart:
    """A checkpoint's records kept apart in ``experiment`` (``reference``: as its manifest
    names them), read on first use."""
    return KeptApart(reference, functools.partial(_read_relative, experiment),
                     experiment.display, is_safe_relpath)


def _read_relative(experiment: Location, name: str) -> bytes:
    """A record file (format 5) or part (8): written once, never replaced."""
    return files.read_bytes(experiment.join(name))


def require_manifest(experiment: Location) -> Manifest:
    """The manifest of a directory that must be an experiment."""
    manifest = read_manifest(experiment)
    if manifest is None:
        raise ManifestError(
            f"{experiment.display} has no manifest.json: it is not an hpckit experiment "
            "directory (pass {storage_path}/{name}).")
    return manifest


def check_root(root: Location) -> None:
    """Refuse a storage path that is a file."""
    if files.file_type(root) == _FT.File:
        raise StorageError(
            f"storage path {root.display} is a file; storage_path must be a directory (or a "
            "bucket prefix) under which hpckit creates one directory per experiment.")


def list_experiments(root: Location) -> list[tuple[str, Manifest | None]]:
    """The experiments directly under a storage root (None for an unreadable manifest)."""
    found: list[tuple[str, Manifest | None]] = []
    for info in files.list_dir(root):
        if info.type != _FT.Directory:
            continue
        try:
            manifest = read_manifest(root.join(info.base_name))
        except (ManifestError, StorageError):
            found.append((info.base_name, None))
            continue
        if manifest is not None:
            found.append((info.base_name, manifest))
    return sorted(found, key=lambda item: item[0])


def read_metrics(experiment: Location) -> list[dict[str, Any]]:
    """Every line of metrics.jsonl (and its later segments, on object storage); a torn last
    line (a crash mid-append) is skipped."""
    return [e for e in map(parse_line, read_log(experiment)) if e is not None]


def read_last_metrics(experiment: Location) -> dict[str, Any] | None:
    """The last whole line of the log (``hpckit ls`` needs no more of a long log)."""
    found = segments(experiment)
    for place in reversed(found[-2:]):  # the last segment may hold only a torn line
        for raw in reversed(files.read_bytes(place).decode(errors="replace").splitlines()):
            entry = parse_line(raw)
            if entry is not None:
                return entry
    return None


def parse_line(raw: str) -> dict[str, Any] | None:
    """A metrics line, or None for a blank or torn one."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("step"), int) else None


SEGMENT_LINES = 1000


def segment_name(number: int) -> str:
    return METRICS_NAME if number == 0 else f"metrics.{number:06d}.jsonl"


def segments(experiment: Location) -> list[Location]:
    """The log's segments that exist, in order (``metrics.jsonl`` alone on a filesystem)."""
    found: list[Location] = []
    while files.file_type(place := experiment.join(segment_name(len(found)))) == _FT.File:
        found.append(place)
    return found


def read_log(experiment: Location) -> list[str]:
    """Every line of the log, segment after segment."""
    return [line for place in segments(experiment)
            for line in files.read_bytes(place).decode(errors="replace").splitlines()]


def rewrite_log(experiment: Location, lines: list[str], unchanged: int = 0) -> None:
    """Replace the log with ``lines`` (each ending in a newline): one object where the storage
    appends, else in segments, the segments beyond the last one removed. The first
    ``unchanged`` lines are those already stored: the segments they fill are not written again."""
    size = max(len(lines), 1) if experiment.is_local else SEGMENT_LINES
    chunks = [lines[i:i + size] for i in range(0, len(lines), size)] or [[]]
    for number, chunk in enumerate(chunks):
        if (number + 1) * size > unchanged or experiment.is_local:
            files.write_atomic(experiment.join(segment_name(number)), "".join(chunk).encode())
    for extra in segments(experiment)[len(chunks):]:
        files.delete_file(extra)
