"""The experiment directory's one owner.

An :class:`Experiment` holds the location, the lock, the current (immutable) manifest, the
metrics log, the background purge and the mirror. Its methods are the only way anything
changes the directory: open (prepare, lock, verify, remove leftovers, begin an attempt),
commit a checkpoint record, log a report without one, end an attempt, collect garbage, close.
Every change writes a new manifest atomically before anything is deleted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import pyarrow.fs

from hpckit import faults, interrupts
from hpckit.config import CheckpointConfig, SyncConfig
from hpckit.errors import ExperimentLockedError, HpckitError, StorageError
from hpckit.experiment import verify
from hpckit.experiment.attempts import Attempt, AttemptStatus
from hpckit.experiment.hangs import hung_unrecorded
from hpckit.experiment.leftovers import leftovers, remove_leftovers, size_of
from hpckit.experiment.lock import LOCK_NAME, Lock
from hpckit.experiment.lock import read as read_lock
from hpckit.experiment.manifest import (
    MANIFEST_NAME,
    CheckpointRecord,
    Manifest,
)
from hpckit.experiment.metrics import MetricsLog
from hpckit.experiment.mirror import Mirror
from hpckit.experiment.purge import Purge
from hpckit.experiment.reading import check_root, read_manifest, require_manifest
from hpckit.experiment.retention import recorded_config, select_evictions
from hpckit.logs import log
from hpckit.settings import Settings
from hpckit.storage import files
from hpckit.storage.location import Location

_FT = pyarrow.fs.FileType


@dataclass(frozen=True)
class Opening:
    """What a run brings to the experiment it opens."""

    name: str
    world_size: int
    command: dict[str, Any]
    config: dict[str, Any]
    retention: dict[str, Any]
    verify_on_resume: bool
    attempt: Attempt
    # How the attempt before ended (failed or hung), as its launcher saw it, and its ranks' PIDs.
    previous_failure: tuple[AttemptStatus, str, frozenset[int]] | None = None
    restored: str | None = None  # the cached checkpoint the ranks assembled (run.restore)


@dataclass(frozen=True)
class Garbage:
    """What :meth:`Experiment.collect_garbage` removes (or would): evicted checkpoints, and
    leftover directories with their sizes."""

    evicted: list[CheckpointRecord]
    leftovers: dict[str, int]

    @property
    def size(self) -> int:
        return sum(r.size for r in self.evicted) + sum(self.leftovers.values())


def prepare(root: Location, name: str) -> Location:
    """The experiment directory, created: the root must be usable and the path not a file."""
    check_root(root)
    experiment = root.join(name)
    if files.file_type(experiment) == _FT.File:
        raise StorageError(f"experiment path {experiment.display} is a file; choose another name.")
    files.make_dir(experiment)
    return experiment


class Experiment:
    """The open experiment (rank 0 of a run, or a maintenance command)."""

    def __init__(self, location: Location, manifest: Manifest, lock: Lock | None = None,
                 metrics: MetricsLog | None = None, mirror: Mirror | None = None) -> None:
        self.location = location
        self._manifest = manifest
        self._lock = lock
        self._metrics = metrics
        self._mirror = mirror
        self._purge = Purge(location)
        self._evicted: list[CheckpointRecord] = []

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @classmethod
    def open(cls, root: Location, opening: Opening, settings: Settings,
             sync: SyncConfig | None = None) -> Experiment:
        """Create or resume the experiment ``opening.name`` under ``root`` and begin an attempt."""
        location = prepare(root, opening.name)
        lock = Lock.acquire(location, settings)
        try:
            found = read_manifest(location)  # read once the lock is ours
            if found is None:
                manifest = Manifest(opening.name, opening.world_size, opening.command,
                                    opening.config, opening.retention, time.time())
            else:
                manifest = _resumable(location, found, opening)
            manifest = manifest.with_attempt(
                _numbered(opening, manifest, found),
                opening.previous_failure or hung_unrecorded(location, manifest))
            _write(location, manifest)
            if found is not None:
                remove_leftovers(location, manifest)
            metrics = MetricsLog.resume(location, manifest.next_step, manifest.latest)
        except BaseException:
            lock.release()
            raise
        mirror = Mirror(location, opening.name, sync) if sync and sync.mirror else None
        return cls(location, manifest, lock, metrics, mirror)

    @classmethod
    def for_maintenance(cls, location: Location, settings: Settings, force: bool) -> Experiment:
        """The experiment for a command that changes it after the fact (``hpckit gc``): refused
        while a live run holds it, unless ``force``."""
        manifest = require_manifest(location)
        holder = read_lock(location.join(LOCK_NAME))
        if not force and holder is not None and holder.stale(
                time.time(), settings.lock_stale_seconds) is None:
            raise ExperimentLockedError(f"{location.display} is in use by a run "
                                        f"({holder.describe()}); wait for it to end, or pass "
                                        "--force if it is dead.")
        last = manifest.last_attempt
        if not force and last is not None and last.status is AttemptStatus.RUNNING:
            raise ExperimentLockedError(
                f"{location.display} looks running (attempt {last.attempt} on {last.host}, pid "
                f"{last.pid}); stop it first, or pass --force if it died without saying so.")
        return cls(location, manifest)

    def commit(self, record: CheckpointRecord, config: CheckpointConfig) -> None:
        """Commit ``record``: the new manifest is written atomically (the commit itself), then
        its metrics line; what retention evicts is deleted later, by :meth:`purge_evicted`."""
        evicted = select_evictions([*self._manifest.checkpoints, record], config)
        updated = self._manifest.with_checkpoint(record, evicted)
        faults.reached("gathered", 0)
        with interrupts.deferred():
            _write(self.location, updated)
            self._manifest = updated
        faults.reached("committed", 0)
        self._evicted += evicted
        if self._metrics is not None:
            self._metrics.append(record.step, record.metrics, record.directory)

    def persisted(self, directory: str) -> None:
        """The cached checkpoint ``directory`` is now complete on storage_path too."""
        self._replace(self._manifest.persisted(directory))

    def _replace(self, updated: Manifest) -> None:
        with interrupts.deferred():
            _write(self.location, updated)
            self._manifest = updated

    def purge_evicted(self) -> None:
        """After every rank has learned the commit: delete what it evicted, in the background,
        and mirror the experiment if a mirror is configured."""
        self._purge.start(self._evicted)
        self._evicted = []
        if self._mirror is not None:
            self._mirror.after_commit(self._manifest)

    def wait_for_purge(self) -> None:
        """Before a new checkpoint is written: the previous eviction has finished."""
        self._purge.wait()

    def log_report(self, step: int, metrics: dict[str, Any]) -> None:
        """A report without a checkpoint: its metrics line only."""
        if self._metrics is not None:
            self._metrics.append(step, metrics, None)

    def history(self) -> list[dict[str, Any]]:
        return self._metrics.history() if self._metrics is not None else []

    def end_attempt(self, status: AttemptStatus, error: str | None = None,
                    reports: int | None = None) -> None:
        """Record how the newest attempt ended; best-effort, since the run is ending anyway."""
        last = self._manifest.last_attempt
        if last is None:
            return
        self._manifest = self._manifest.with_last_attempt(last.ended(status, error, reports))
        try:
            _write(self.location, self._manifest)
        except StorageError as exc:
            log.warning("could not record the attempt's end in the manifest: %s", exc)

    def collect_garbage(self, keep: int | None, dry_run: bool) -> Garbage:
        """Apply retention with ``keep`` after the fact and remove leftovers no manifest names;
        the manifest is written before anything is deleted."""
        manifest = self._manifest
        evicted = select_evictions(list(manifest.checkpoints), recorded_config(manifest, keep))
        garbage = Garbage(evicted, {name: size_of(self.location.join(name))
                                    for name in leftovers(self.location, manifest)})
        if dry_run:
            return garbage
        if evicted:
            self._manifest = manifest.without(evicted)
            _write(self.location, self._manifest)
        for name in [r.directory for r in evicted] + list(garbage.leftovers):
            files.delete_dir(self.location.join(name))  # a command: a failure is its error
        return garbage

    def close(self, promptly: bool = False) -> None:
        """Finish the purge and the mirror, close the metrics log, release the lock.
        ``promptly`` (after Ctrl-C) leaves the purge and the mirror to the next run."""
        try:
            if not promptly:
                self._purge.wait()
            if self._metrics is not None:
                self._metrics.close()
            if self._mirror is not None and not promptly:
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


def _numbered(opening: Opening, manifest: Manifest, found: Manifest | None) -> Attempt:
    """This run's attempt, numbered across every run of the experiment (not per run), with
    its configuration when that differs from the attempt before."""
    changed = found is None or found.config != opening.config or not found.attempts
    return replace(opening.attempt, attempt=len(manifest.attempts),
                   config=opening.config if changed else None)


def _resumable(location: Location, manifest: Manifest, opening: Opening) -> Manifest:
    """The manifest of a run being resumed: links out of it and damaged checkpoints dropped,
    this run's retention, world size, command and configuration recorded (``hpckit resume``
    repeats the latest)."""
    manifest = manifest.without(verify.escaping(location, manifest))
    manifest = manifest.without(_unservable(manifest, opening.restored))
    if opening.verify_on_resume:
        manifest = manifest.without(verify.damaged(location, manifest))
    latest = manifest.latest
    if manifest.world_size != opening.world_size:
        log.warning("resuming %s with %d ranks; it was recorded with %d", opening.name,
                    opening.world_size, manifest.world_size)
    log.info("resuming experiment %s from %s", location.display,
             latest.directory if latest else "its start (no checkpoint was committed)")
    return replace(manifest, next_step=latest.step + 1 if latest else 0,
                    retention=opening.retention, world_size=opening.world_size,
                    command=opening.command, config=opening.config)


def _unservable(manifest: Manifest, restored: str | None) -> list[CheckpointRecord]:
    """Cached checkpoints newer than what this run restarts from: no node of it holds them."""
    floor = max((r.index for r in manifest.checkpoints if r.on_storage or r.directory == restored),
                default=-1)
    gone = [r for r in manifest.checkpoints if not r.on_storage and r.index > floor]
    if gone:
        log.warning("dropped %s from the manifest: in node-local caches that this run cannot "
                    "read (no cache_dir, or other nodes); the run repeats their work",
                    ", ".join(r.directory for r in gone))
    return gone


def _write(location: Location, manifest: Manifest) -> None:
    files.write_atomic(location.join(MANIFEST_NAME), manifest.to_json().encode())
