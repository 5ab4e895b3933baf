"""Commands that change an experiment after the fact (``hpckit gc``): whether they may (no
live run holds it), and what garbage collection removes."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace

from pyarrow.fs import FileType

from hpckit.errors import ExperimentLockedError
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.leftovers import leftovers, size_of, stray_records
from hpckit.experiment.lock import LOCK_NAME, Lock
from hpckit.experiment.lock import read as read_lock
from hpckit.experiment.manifest import CheckpointRecord, Manifest
from hpckit.settings import Settings
from hpckit.storage import files
from hpckit.storage.location import Location


@dataclass(frozen=True)
class Garbage:
    """What :meth:`Experiment.collect_garbage` removes (or would): evicted checkpoints, and
    leftover directories and record files with their sizes; and the leftovers it ``kept``
    because the newest attempt says it is running (``gc --force``): they may be the pending
    checkpoint that run is writing."""

    evicted: list[CheckpointRecord]
    leftovers: dict[str, int]
    kept: dict[str, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(r.size for r in self.evicted) + sum(self.leftovers.values())


def find_garbage(location: Location, manifest: Manifest,
                 evicted: list[CheckpointRecord]) -> Garbage:
    """The ``evicted`` checkpoints, and what no manifest names: leftover directories and
    record files, kept where the newest attempt may still be writing them."""
    found = {**{name: size_of(location.join(name)) for name in leftovers(location, manifest)},
             **stray_records(location, manifest)}
    last = manifest.last_attempt
    if last is not None and last.status is AttemptStatus.RUNNING:
        return Garbage(evicted, {}, found)
    return Garbage(evicted, found)


def remove_garbage(location: Location, garbage: Garbage) -> None:
    """Delete the garbage (after the manifest stopped naming it); a failure is raised."""
    for record in garbage.evicted:
        files.delete_dir(location.join(record.directory))
        if record.records is not None:
            files.delete_file(location.join(record.records.name), missing_ok=True)
    for name in garbage.leftovers:
        target = location.join(name)
        if files.file_type(target) == FileType.File:
            files.delete_file(target)
        else:
            files.delete_dir(target)


def maintenance_lock(location: Location, manifest: Manifest, settings: Settings, force: bool,
                     dry_run: bool) -> Lock | None:
    """The experiment's lock for a maintenance command (none for a ``dry_run``, which changes
    nothing): refused while a live run holds it, unless ``force``, which takes it over all
    the same (compare and swap: the run that held it writes nothing more and fails at its
    next report, naming this command)."""
    refuse_if_running(location, manifest, settings, force)
    if dry_run:
        return None
    command = replace(settings, run_id=f"hpckit gc {uuid.uuid4().hex[:8]}")
    return Lock.acquire(location, command, force)


def refuse_if_running(location: Location, manifest: Manifest, settings: Settings,
                      force: bool) -> None:
    """Refused while a live run holds the experiment, unless ``force``."""
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
