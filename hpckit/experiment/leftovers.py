"""What a crashed run leaves in an experiment directory that no manifest names: numbered or
custom-named checkpoint directories before their commit, staged files, manifest temp files.

Commands that change an experiment after the fact (``hpckit gc``): whether they may (no
live run holds it), and what garbage collection removes.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace

import pyarrow.fs
from pyarrow.fs import FileType

from hpckit.errors import ExperimentLockedError, StorageError
from hpckit.experiment import journal
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.lock import LOCK_NAME, Lock
from hpckit.experiment.lock import read as read_lock
from hpckit.experiment.manifest import (
    MANIFEST_NAME,
    PENDING_MARKER,
    RESERVED_NAMES,
    STAGING_NAME,
    CheckpointRecord,
    Manifest,
    is_checkpoint_dirname,
)
from hpckit.experiment.records import RECORDS_DIR
from hpckit.logs import log
from hpckit.settings import Settings
from hpckit.storage import files
from hpckit.storage.location import Location

_FT = pyarrow.fs.FileType


def leftovers(location: Location, manifest: Manifest) -> list[str]:
    """Directories no manifest names that a run made: numbered or staging ones, and those a
    custom-named checkpoint left before its commit (they hold the pending marker). Never the
    staging while it holds a hand-over's journal: files of the user's that only it holds
    (:mod:`hpckit.experiment.journal`)."""
    named = {r.directory for r in manifest.checkpoints}
    found = [i.base_name for i in files.list_dir(location)
             if i.type == _FT.Directory and i.base_name not in named]
    return [name for name in found if is_checkpoint_dirname(name)
            or (name == STAGING_NAME and not handed_files_in(location))
            or (name not in RESERVED_NAMES
                and files.file_type(location.join(name, PENDING_MARKER)) == _FT.File)]


def handed_files_in(location: Location) -> list[str]:
    """The hand-over journals in the experiment's staging (POSIX storage only)."""
    return journal.found([location.join(STAGING_NAME).path]) if location.is_local else []


def put_back_handed(location: Location, last: Manifest) -> None:
    """Before leftovers go: the files hand-overs of an earlier attempt moved into the
    experiment's staging for checkpoints that did not commit (``last``: the manifest as that
    attempt left it) go back where they were."""
    if location.is_local:
        journal.replay([location.join(STAGING_NAME).path], last.next_checkpoint_index)


def size_of(location: Location) -> int:
    return sum(size for _, size in files.list_files(location))


def stray_records(location: Location, manifest: Manifest) -> dict[str, int]:
    """Record files (and their temp files) that no manifest names, with their sizes: a commit
    killed after writing its checkpoint's records, or an eviction cut short."""
    named = {r.records.name for r in manifest.checkpoints if r.records is not None}
    found = {f"{RECORDS_DIR}/{i.base_name}": i.size
             for i in files.list_dir(location.join(RECORDS_DIR)) if i.type == _FT.File}
    return {name: size for name, size in found.items() if name not in named}


def remove_leftovers(location: Location, manifest: Manifest) -> list[str]:
    """Delete checkpoint directories, staged files, temp files and record files that no
    manifest names (a crashed commit's)."""
    removed = []
    temp = [i.base_name for i in files.list_dir(location) if i.type == _FT.File
            and i.base_name.startswith(f".{MANIFEST_NAME}.tmp-")]
    temp += list(stray_records(location, manifest))
    for name in [*leftovers(location, manifest), *temp]:
        target = location.join(name)
        try:
            files.delete_file(target) if name in temp else files.delete_dir(target)
            removed.append(name)
        except StorageError as exc:
            log.warning("could not remove leftover %s: %s", name, exc)
    if removed:
        log.warning("removed leftovers of an interrupted run that no manifest names: %s",
                    ", ".join(sorted(removed)))
    return removed


def free(target: Location) -> bool:
    """Nothing is there, or an empty directory: what a run killed between making a reserved
    directory and marking it pending leaves (on S3 a directory marker), which no leftover
    check can tell from a user's directory, and which holds nothing to lose."""
    kind = files.file_type(target)
    return kind == pyarrow.fs.FileType.NotFound or (
        kind == pyarrow.fs.FileType.Directory and not files.list_files(target))


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
