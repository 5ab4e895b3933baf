"""What a crashed run leaves in an experiment directory that no manifest names: numbered or
custom-named checkpoint directories before their commit, staged files, manifest temp files."""

from __future__ import annotations

import pyarrow.fs

from hpckit.errors import StorageError
from hpckit.experiment import journal
from hpckit.experiment.manifest import (
    MANIFEST_NAME,
    PENDING_MARKER,
    RESERVED_NAMES,
    STAGING_NAME,
    Manifest,
    is_checkpoint_dirname,
)
from hpckit.experiment.records import RECORDS_DIR
from hpckit.logs import log
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
