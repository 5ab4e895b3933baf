"""Re-read a committed checkpoint and compare every file with the manifest."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs

from hpckit import _storage
from hpckit._manifest import CheckpointRecord
from hpckit._uri import Location
from hpckit.errors import StorageError


@dataclass(frozen=True)
class Problem:
    directory: str
    path: str
    what: str

    def __str__(self) -> str:
        return f"{self.directory}/{self.path}: {self.what}"


def verify(experiment: Location, record: CheckpointRecord) -> list[Problem]:
    """Every file of ``record`` that is missing, of the wrong size, or has the wrong sha256."""
    problems = []
    for f in record.files:
        location = experiment.join(record.directory, f.path)
        if _storage.file_type(location) != pyarrow.fs.FileType.File:
            problems.append(Problem(record.directory, f.path, "missing"))
            continue
        try:
            size, digest = _storage.sha256_stored(location)
        except StorageError as exc:
            problems.append(Problem(record.directory, f.path, f"unreadable ({exc})"))
            continue
        if size != f.size:
            problems.append(Problem(record.directory, f.path, f"size {size}, manifest says {f.size}"))
        elif digest != f.sha256:
            problems.append(Problem(record.directory, f.path,
                                    f"sha256 {digest[:12]}..., manifest says {f.sha256[:12]}..."))
    return problems
