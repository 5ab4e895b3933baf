"""Re-read a committed checkpoint and compare every file with the manifest."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow.fs

from hpckit.errors import CheckpointError, StorageError
from hpckit.experiment.manifest import CheckpointRecord, FileRecord, Manifest
from hpckit.logs import log
from hpckit.storage import files
from hpckit.storage.copy import algorithm_of, checksum_stored, short
from hpckit.storage.location import Location

PARALLEL_READS = 8


@dataclass(frozen=True)
class Problem:
    directory: str
    path: str
    what: str
    unreadable: bool = False

    def __str__(self) -> str:
        return f"{self.directory}/{self.path}: {self.what}" if self.path else \
            f"{self.directory}: {self.what}"


def verify(experiment: Location, record: CheckpointRecord) -> list[Problem]:
    """Every file of ``record`` that is missing, of the wrong size, or has the wrong checksum.
    Files are read back in parallel, as large checkpoints have many shards. A checkpoint
    whose record file is damaged has nothing to compare with: that is its problem."""
    if record.damaged is not None:
        return [Problem(record.directory, "", record.damaged)]
    with ThreadPoolExecutor(max(1, min(PARALLEL_READS, len(record.files)))) as pool:
        found = pool.map(lambda f: _check(experiment.join(record.directory, f.path), record, f,
                                          experiment), record.files)
        return [p for p in found if p is not None]


def _check(location: Location, record: CheckpointRecord, f: FileRecord,
           experiment: Location) -> Problem | None:
    if files.escapes(location, experiment):
        return Problem(record.directory, f.path, "a symbolic link out of the experiment directory "
                       "(not followed)")
    if files.file_type(location) != pyarrow.fs.FileType.File:
        return Problem(record.directory, f.path, "missing")
    try:
        size, digest = checksum_stored(location, algorithm_of(f.checksum))
    except StorageError as exc:
        return Problem(record.directory, f.path, f"unreadable ({exc})", unreadable=True)
    if size != f.size:
        return Problem(record.directory, f.path, f"size {size}, manifest says {f.size}")
    if digest != f.checksum:
        return Problem(record.directory, f.path,
                       f"checksum {short(digest)}, manifest says {short(f.checksum)}")
    return None


def escaping(experiment: Location, manifest: Manifest) -> list[CheckpointRecord]:
    """Checkpoints whose directory is a symbolic link out of the experiment: hpckit never
    reads, writes or deletes outside it, whatever the manifest says."""
    found = [r for r in manifest.checkpoints if r.on_storage
             and files.escapes(experiment.join(r.directory), experiment)]
    for record in found:
        log.warning("!!! %s is a symbolic link out of %s; it is not resumed from, and only the "
                    "link is removed", record.directory, experiment.display)
    return found


def damaged(experiment: Location, manifest: Manifest) -> list[CheckpointRecord]:
    """Verify checkpoints newest first until one is intact; return the damaged ones ahead of it.

    A file that cannot be read (as opposed to one that reads back wrong) is an error: storage
    that fails now may be fine later, and a good checkpoint must not be skipped for it.
    """
    found = []
    stored = [r for r in manifest.checkpoints if r.on_storage]  # cached ones: run.restore
    for record in sorted(stored, key=lambda r: r.index, reverse=True):
        started = time.perf_counter()
        problems = verify(experiment, record)
        unreadable = [p for p in problems if p.unreadable]
        if unreadable:
            raise StorageError(f"cannot verify {experiment.join(record.directory).display} before "
                               f"resuming: {unreadable[0]}. Fix the storage and run again.")
        if not problems:
            log.info("verified %s (%d file(s), %d bytes) in %.2f s", record.directory,
                     len(record.files), record.size, time.perf_counter() - started)
            break
        log.warning("!!! %s is DAMAGED and will not be resumed from: %s. It is dropped from the "
                    "manifest and removed; resuming from the newest checkpoint that verifies.",
                    record.directory, "; ".join(map(str, problems)))
        found.append(record)
    if found and len(found) == len(stored):
        raise CheckpointError(
            f"no committed checkpoint of {experiment.display} verifies (damaged: "
            f"{', '.join(r.directory for r in found)}); nothing was changed. Restore the files, "
            "run `hpckit verify` for details, or start a new experiment (another name).")
    return found
