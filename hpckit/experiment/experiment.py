"""The experiment directory's one owner.

An :class:`Experiment` holds the location, lock, current (immutable) manifest, metrics log,
background purge and mirror; its methods are the only way a run changes the directory's own
files (open, commit, reserve, clear or discard a checkpoint directory, markers, a report
without a checkpoint, an attempt's end, garbage collection, close). One thread, the
experiment's :class:`~.writer.Writer`, makes a run's changes, whichever thread of rank 0 asks.
Every change writes a new manifest atomically before anything is deleted, and each write is
fenced: made only while the lock holds the run's token (``Lock.confirm``; the manifest through
``Lock.write``, exactly on POSIX storage). Each rank writes the
files of a pending checkpoint (``run.writing``, ``run.levels``) before rank 0 commits them
here; ``tests/test_invariants.py`` names every such writer.

Deleting what retention evicts, after the commit and off the training path.

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
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import replace
from typing import Any

from hpckit import faults
from hpckit.background import NORMAL, Worker
from hpckit.config import CheckpointConfig, SyncConfig
from hpckit.errors import (
    CheckpointError,
    ExperimentClosedError,
    ExperimentTakenError,
    HpckitError,
    StorageError,
)
from hpckit.experiment import encoding
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.leftovers import (
    Garbage,
    find_garbage,
    free,
    maintenance_lock,
    put_back_handed,
    remove_garbage,
)
from hpckit.experiment.lock import Lock
from hpckit.experiment.manifest import (
    MANIFEST_NAME,
    PENDING_MARKER,
    VISIBLE_PREFIX,
    CheckpointRecord,
    Manifest,
    Validation,
    is_checkpoint_dirname,
)
from hpckit.experiment.metrics import MetricsLog
from hpckit.experiment.mirror import Mirror
from hpckit.experiment.opening import Opening, begin
from hpckit.experiment.reading import read_manifest, require_manifest
from hpckit.experiment.records import RECORDS_DIR, filed, filed_apart
from hpckit.experiment.retention import recorded_config, select_evictions
from hpckit.experiment.writer import Writer, written
from hpckit.logs import log
from hpckit.settings import Settings
from hpckit.storage import files
from hpckit.storage.location import Location


class Experiment:
    """The open experiment (rank 0 of a run, or a maintenance command)."""

    def __init__(self, location: Location, manifest: Manifest, lock: Lock | None = None,
                 metrics: MetricsLog | None = None, mirror: Mirror | None = None) -> None:
        self.location = location
        self._manifest = manifest
        self._lock = lock
        self._metrics = metrics
        self._mirror = mirror
        self._purge = Purge(location, self._fence)
        # A run's changes come from several threads of rank 0: one thread makes them all.
        self.writer = Writer(location.display, inline=lock is None)

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @classmethod
    def open(cls, root: Location, opening: Opening, settings: Settings,
             sync: SyncConfig | None = None) -> Experiment:
        """Create or resume the experiment ``opening.name`` under ``root`` and begin an attempt."""
        location, lock, manifest, metrics = begin(root, opening, settings, _write)
        mirror = Mirror(location, opening.name, sync) if sync and sync.mirror else None
        return cls(location, manifest, lock, metrics, mirror)

    @classmethod
    def for_maintenance(cls, location: Location, settings: Settings, force: bool,
                        dry_run: bool = False) -> Experiment:
        """The experiment for ``hpckit gc``, holding its lock until :meth:`close` (a ``dry_run``
        takes none; ``force`` takes a live run's: maintenance_lock); read again once locked."""
        lock = maintenance_lock(location, require_manifest(location), settings, force, dry_run)
        return cls(location, require_manifest(location), lock)

    @written
    def commit(self, record: CheckpointRecord, config: CheckpointConfig,
               index: bytes | None = None) -> None:
        """Commit ``record``, at whichever level it is: its metrics line first, then the new
        manifest, written atomically (the commit itself), so that after a kill at any moment
        the metrics are never behind the latest committed checkpoint (a resume drops a line
        whose checkpoint did not commit). Then what retention evicts is deleted in the
        background, and the mirror (if any) follows. ``index``: the bytes of the parts' index."""
        record = self._filed(record, index)
        evicted = select_evictions([*self._manifest.checkpoints, record], config)
        updated = self._manifest.with_checkpoint(record, evicted)
        faults.reached("gathered", 0)
        if self._metrics is not None:
            self._fence()
            self._metrics.append(record.step, record.metrics, record.directory)
        try:
            self._replace(updated)
        except (ExperimentTakenError, ExperimentClosedError):
            raise  # this run writes nothing more, not even a retraction
        except HpckitError:
            if self._metrics is not None:
                self._metrics.retract_unless_committed(self.location, record.directory)
            raise
        faults.reached("committed", 0)
        if self._metrics is not None:
            self._metrics.tracked(record.step, record.metrics)
        if not is_checkpoint_dirname(record.directory):
            self._unmark_pending(record.directory)
        self._purge.start(evicted)
        if self._mirror is not None:
            self._mirror.after_commit(self._manifest)

    def _filed(self, record: CheckpointRecord, index: bytes | None) -> CheckpointRecord:
        """Records of many files are kept apart; a checkpoint of none gets its directory."""
        if record.records is None and not filed_apart(record.files):
            if not record.files and record.on_storage:
                files.make_dir(self.location.join(record.directory))
            return record
        reference, data = ((record.records, index) if record.records is not None and index
                           else filed(record.directory, record.index, record.files))
        self._fence()
        files.make_dir(self.location.join(RECORDS_DIR))
        files.write_atomic(self.location.join(reference.name), data)
        return replace(record, records=reference)

    @written
    def reserve(self, directory: str, planned: tuple[str, ...], uploading: bool = False) -> None:
        """A checkpoint directory the user named (``report(checkpoint_dir_name=...)``):
        refused if a committed or ``planned`` checkpoint has it or it holds files (unless
        ``uploading``: the user's ``checkpoint_upload_fn`` may be writing there already),
        else made and marked pending, so that a run killed before its commit leaves a
        leftover that resume recognises."""
        target = self.location.join(directory)
        taken = {r.directory for r in self._manifest.checkpoints} | set(planned)
        if directory in taken or not (uploading or free(target)):
            raise CheckpointError(
                f"report(checkpoint_dir_name={directory!r}): {target.display} already exists; "
                "give each checkpoint its own name (e.g. with the epoch in it).")
        self._fence()
        files.make_dir(target)
        files.write_bytes(target.join(PENDING_MARKER), b"")

    @written
    def clear(self, directory: str) -> None:
        """A checkpoint directory about to be written, emptied of what an earlier report left
        there (files written in place, then another directory handed)."""
        self._fence()
        files.delete_dir(self.location.join(directory))

    def _unmark_pending(self, directory: str) -> None:
        try:
            files.delete_file(self.location.join(directory, PENDING_MARKER), missing_ok=True)
        except HpckitError as exc:  # committed all the same; the marker is harmless
            log.warning("could not remove %s's pending marker (harmless; hpckit gc removes it): "
                        "%s", self.location.join(directory).display, exc)

    @written
    def leave_marker(self) -> str:
        """A marker file that every rank must see (the storage is shared); its name."""
        marker = f"{VISIBLE_PREFIX}{uuid.uuid4().hex}"
        files.write_bytes(self.location.join(marker), b"")
        return marker

    @written
    def remove_marker(self, marker: str) -> None:
        files.delete_file(self.location.join(marker))

    @written
    def discard(self, directory: str) -> None:
        """A checkpoint that failed before its commit: its directory is removed, best-effort
        (the manifest never named it, and a resume removes what is left). Never once another
        run took the experiment over: the directory may be that run's now."""
        try:
            self._fence()
            files.delete_dir(self.location.join(directory))
        except (ExperimentTakenError, ExperimentClosedError) as exc:
            log.debug("not removing %s: %s", directory, exc)
        except HpckitError as exc:
            log.warning("could not remove failed checkpoint %s (resume removes it): %s",
                        self.location.join(directory).display, exc)

    @written
    def reached_storage(self, directory: str) -> None:
        """The cached checkpoint ``directory`` is now complete on storage_path too."""
        self._replace(self._manifest.reached_storage(directory))

    @written
    def record_validation(self, directory: str, validation: Validation,
                          config: CheckpointConfig) -> None:
        """``directory``'s validation, as it now stands; once it has ended, retention ranks
        the checkpoint by its merged metrics and what it evicts is deleted in the background.
        A checkpoint no longer in the manifest is left alone."""
        if not any(r.directory == directory for r in self._manifest.checkpoints):
            return
        updated = self._manifest.validated(directory, validation)
        evicted = select_evictions(updated.checkpoints, config)
        self._replace(updated.without(evicted))
        self._purge.start(evicted)
        if self._mirror is not None:
            self._mirror.after_commit(self._manifest)

    def _replace(self, updated: Manifest) -> None:
        """Write ``updated`` (with the tracker runs opened since the last write) as the
        manifest, fenced."""
        opened = self._metrics.trackers.run_ids if self._metrics and self._metrics.trackers else {}
        if any(updated.tracker_runs.get(name) != run for name, run in opened.items()):
            updated = replace(updated, tracker_runs={**updated.tracker_runs, **opened})
        elif updated is self._manifest:
            return  # nothing new to write
        if self._lock is None:
            _write(self.location, updated)
        else:
            self._lock.write(self.location.join(MANIFEST_NAME), encoding.to_json(updated).encode())
        self._manifest = updated

    def _record_tracker_runs(self) -> None:
        """Tracker runs that opened after the attempt's last manifest write: recorded, so
        that a resume continues them (best-effort; a resume finds an MLflow run by its tag)."""
        try:
            self._replace(self._manifest)  # merges the runs opened since (a no-op write else)
        except HpckitError as exc:
            log.warning("could not record the experiment's tracker runs in its manifest: %s", exc)

    def _fence(self) -> None:
        """Right before each write of the run's: the lock still holds this run's token, else
        :class:`ExperimentTakenError` (a maintenance command holds no lock)."""
        if self._lock is not None:
            self._lock.confirm()

    def check_lock(self) -> None:
        """At each collective step: an :class:`ExperimentTakenError` at once where another run
        took the experiment over, so every rank fails together at that step."""
        if self._lock is not None:
            self._lock.check()

    def wait_for_purge(self) -> None:
        """Before a new checkpoint is written: the previous eviction has finished."""
        self._purge.wait()

    @written
    def log_report(self, step: int, metrics: dict[str, Any]) -> None:
        """A report without a checkpoint: its metrics line only."""
        if self._metrics is not None:
            self._fence()
            self._metrics.append(step, metrics, None)
            self._metrics.tracked(step, metrics)

    @written
    def history(self) -> list[dict[str, Any]]:
        """Every metrics line, after the lines handed to the writer are written."""
        return self._metrics.history() if self._metrics is not None else []

    @written
    def end_attempt(self, status: AttemptStatus, error: str | None = None,
                    reports: int | None = None) -> None:
        """Record how the newest attempt ended; best-effort, since the run is ending anyway.
        Not once another run took the experiment over: its manifest is that run's now."""
        last = self._manifest.last_attempt
        if last is None:
            return
        try:
            self._replace(self._manifest.with_last_attempt(last.ended(status, error, reports)))
        except (ExperimentTakenError, ExperimentClosedError) as exc:
            log.debug("the attempt's end is not recorded: %s", exc)
        except StorageError as exc:
            log.warning("could not record the attempt's end in the manifest: %s", exc)

    @written
    def collect_garbage(self, keep: int | None, dry_run: bool) -> Garbage:
        """Apply retention with ``keep`` after the fact and remove leftovers no manifest names;
        the manifest is written before anything is deleted."""
        manifest = self._manifest
        evicted = select_evictions(list(manifest.checkpoints), recorded_config(manifest, keep))
        last = manifest.last_attempt
        if not dry_run and (last is None or last.status is not AttemptStatus.RUNNING):
            put_back_handed(self.location, manifest)  # before their staging can go
        garbage = find_garbage(self.location, manifest, evicted)
        if dry_run:
            return garbage
        if evicted:
            self._replace(manifest.without(evicted))
        remove_garbage(self.location, garbage)  # a command: a failure is its error
        return garbage

    def close(self, promptly: bool = False) -> None:
        """Refuse every later write (a validation thread that outlived its attempt's end
        writes nothing), finish the purge and the mirror, close the metrics log, release the
        lock.
        ``promptly`` (after Ctrl-C) leaves the purge and the mirror to the next run; a run that
        lost the lock mirrors nothing more, and leaves the lock to the run that holds it."""
        try:
            self.writer.close()  # the changes handed over are made; none after
            taken = self._lock is not None and self._lock.lost is not None
            self._purge.close(promptly)
            if self._metrics is not None:  # the tracker runs end as the attempt ended
                self._metrics.close(None if taken else self._manifest.last_attempt)
                if not taken:
                    self._record_tracker_runs()
            if self._mirror is not None and not (promptly or taken):
                self._mirror.close(self._manifest)
        finally:
            if self._lock is not None:
                self._lock.release()


def end_abandoned_attempt(location: Location, error: str,
                          status: AttemptStatus = AttemptStatus.FAILED) -> None:
    """The ranks of an attempt died before they could say so (the launcher saw them fail):
    mark their attempt failed (or ``status``). Best-effort; nothing else is changed."""
    try:
        manifest = read_manifest(location)
    except HpckitError as exc:
        log.debug("could not read %s to record the failure: %s", location.display, exc)
        return
    last = manifest.last_attempt if manifest else None
    if manifest is not None and last is not None and last.status is AttemptStatus.RUNNING:
        Experiment(location, manifest).end_attempt(status, error)


def _write(location: Location, manifest: Manifest) -> None:
    files.write_atomic(location.join(MANIFEST_NAME), encoding.to_json(manifest).encode())


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
