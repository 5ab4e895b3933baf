"""Deleting what retention evicts, after the commit and off the training path.

Rank 0's :class:`~hpckit.experiment.experiment.Experiment` hands the evicted checkpoints to
a background thread as soon as the new manifest is written (the commit), so no rank waits on
deletes (slow on S3) inside ``report()``. Before any rank writes a new checkpoint, rank 0
waits for the deletions handed over so far, so the experiment never holds more than the kept
checkpoints plus the one being written. A failed
deletion is logged, never fatal: the directory is no longer in the manifest, and the next
resume removes it as a leftover. Each checkpoint is deleted only after the run's lock is
confirmed (``fence``): once another run took the experiment over, the directory may be
that run's, and nothing more is deleted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for

from hpckit import faults
from hpckit.background import NORMAL, Worker
from hpckit.errors import ExperimentTakenError, StorageError
from hpckit.experiment.manifest import CheckpointRecord
from hpckit.logs import log
from hpckit.storage import files
from hpckit.storage.location import Location


def evict(experiment: Location, records: list[CheckpointRecord],
          fence: Callable[[], None] | None = None) -> None:
    """Delete evicted checkpoints: the files the manifest named first, then the directory, so
    a deletion cut short leaves a directory that no manifest names. ``fence`` raises
    :class:`ExperimentTakenError` where the run no longer holds the experiment."""
    for record in records:
        started = time.perf_counter()
        target = experiment.join(record.directory)
        try:
            if fence is not None:
                fence()
            cached = not record.on_storage  # nothing of it on storage_path, but a cut drain's
            # Records in parts (format 8), one per node: the directory goes whole, unread.
            in_parts = bool(record.records and record.records.parts)
            for f in [] if cached or in_parts or files.escapes(target, experiment) else record.files:
                files.delete_file(target.join(f.path), missing_ok=True)
                faults.reached("evicting", 0)
            if in_parts:
                faults.reached("evicting", 0)
            files.delete_dir(target)
            if record.records is not None:
                files.delete_file(experiment.join(record.records.name), missing_ok=True)
            log.debug("retention removed %s in %.3f s", record.directory,
                      time.perf_counter() - started)
        except ExperimentTakenError:
            log.info("retention removes nothing more: the experiment is another run's now")
            return
        except StorageError as exc:
            log.warning("retention could not remove %s (it is no longer in the manifest and "
                        "will be removed on resume): %s", record.directory, exc)


class Purge:
    """A background worker deletes what the commits evicted, in commit order.
    A commit hands its evictions over without waiting: several checkpoints committed in one
    step (background checkpoints that finished together) cost the collective nothing."""

    def __init__(self, experiment: Location, fence: Callable[[], None] | None = None) -> None:
        self.experiment = experiment
        self.fence = fence
        # Normal priority: the next checkpoint waits for it (Experiment.wait_for_purge).
        self._worker = Worker("hpckit-purge", NORMAL)
        self._handed: list[Future[None]] = []
        self._handing = threading.Lock()  # the writer hands over, the training thread waits

    def start(self, records: list[CheckpointRecord]) -> None:
        if records:
            with self._handing:
                self._handed = [f for f in self._handed if not f.done()]
                self._handed.append(self._worker.submit(self._evict, records))

    def _evict(self, records: list[CheckpointRecord]) -> None:
        try:
            evict(self.experiment, records, self.fence)
        except Exception as exc:  # noqa: BLE001  (best-effort: a resume removes what is left)
            log.warning("retention could not remove %s (they are no longer in the manifest "
                        "and will be removed on resume): %r",
                        ", ".join(r.directory for r in records), exc)

    def wait(self) -> None:
        """Until everything handed over so far is deleted."""
        with self._handing:
            handed = list(self._handed)
        wait_for(handed)

    def close(self, promptly: bool = False) -> None:
        """At the end of the attempt: the deletions handed over are made (``promptly``: left
        to the next run's leftover removal), and the worker's thread ends."""
        if not promptly:
            self.wait()
        self._worker.stop(wait=not promptly, cancel=promptly)
