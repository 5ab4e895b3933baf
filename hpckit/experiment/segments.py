"""``metrics.jsonl`` where storage cannot append (object stores): a log in segments.

An object cannot be appended to, only replaced, so a log kept as one object would be rewritten
whole at every report: O(reports²) bytes over a run, and the whole log in rank 0's memory.
There, the log is cut into segments of :data:`SEGMENT_LINES` lines: ``metrics.jsonl`` holds
the first, ``metrics.000001.jsonl`` the next, and so on. A report replaces only the last
segment (at most a segment's bytes), and a full segment is never written again. Readers read
them in order (:func:`read_log`). On a filesystem, ``metrics.jsonl`` is appended to and is the
whole log.
"""

from __future__ import annotations

import pyarrow.fs

from hpckit.experiment.manifest import METRICS_NAME
from hpckit.storage import files
from hpckit.storage.location import Location

SEGMENT_LINES = 1000
_FT = pyarrow.fs.FileType


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
