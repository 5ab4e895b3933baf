"""Deleting what retention evicts, after the commit and off the training path.

Rank 0 hands the evicted checkpoints to one background thread once every rank has learned
the commit, so no rank waits on deletes (slow on S3) inside ``report()``. At most one purge
is in flight: the next commit waits for it before any rank writes a new checkpoint, so the
experiment never holds more than the kept checkpoints plus the one being written. A failed
deletion is logged, never fatal: the directory is no longer in the manifest, and the next
resume removes it as a leftover.
"""

from __future__ import annotations

import threading
import time

from hpckit import faults
from hpckit.errors import StorageError
from hpckit.experiment.manifest import CheckpointRecord
from hpckit.logs import log
from hpckit.storage import files
from hpckit.storage.location import Location


def evict(experiment: Location, records: list[CheckpointRecord]) -> None:
    """Delete evicted checkpoints: the files the manifest named first, then the directory, so
    a deletion cut short leaves a directory that no manifest names."""
    for record in records:
        started = time.perf_counter()
        target = experiment.join(record.directory)
        try:
            cached = not record.on_storage  # nothing of it on storage_path, but a cut drain's
            for f in [] if cached or files.escapes(target, experiment) else record.files:
                files.delete_file(target.join(f.path), missing_ok=True)
                faults.reached("evicting", 0)
            files.delete_dir(target)
            log.debug("retention removed %s in %.3f s", record.directory,
                      time.perf_counter() - started)
        except StorageError as exc:
            log.warning("retention could not remove %s (it is no longer in the manifest and "
                        "will be removed on resume): %s", record.directory, exc)


class Purge:
    """One background deletion at a time."""

    def __init__(self, experiment: Location) -> None:
        self.experiment = experiment
        self._thread: threading.Thread | None = None

    def start(self, records: list[CheckpointRecord]) -> None:
        self.wait()
        if records:
            self._thread = threading.Thread(target=evict, args=(self.experiment, records),
                                            name="hpckit-purge", daemon=True)
            self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
