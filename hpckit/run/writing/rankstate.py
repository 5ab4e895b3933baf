"""Each rank's resume state (its random streams and its loaders' positions, as bytes the
session gives) kept as one file of the checkpoint it goes with, ``.hpckit-resume/rank-NNNNN``:
written by the rank itself beside its share and recorded like any file, so that it is
committed, verified, exported and deleted with the checkpoint. Names under that folder in a
handed or in-place directory are hpckit's, never the user's: listings leave them out."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow.fs

from hpckit import faults
from hpckit.experiment.manifest import RANK_STATE_DIR, FileRecord
from hpckit.run.writing.plan import Persisted
from hpckit.storage import files
from hpckit.storage.checksum import checksum_of
from hpckit.storage.location import Location


def state_name(rank: int) -> str:
    return f"{RANK_STATE_DIR}/rank-{rank:05d}"


def write_state(target: Location, rank: int, data: bytes) -> FileRecord:
    """``data`` written durably into checkpoint ``target`` as this rank's state file."""
    name = state_name(rank)
    if target.is_local:  # object storage has no directories (a marker object would be one more)
        files.make_dir(target.join(RANK_STATE_DIR))
    files.write_atomic(target.join(name), data)
    faults.reached("resume_state", rank)
    return FileRecord(name, len(data), rank, checksum_of(data))


def with_state(persist: Callable[[], Persisted], target: Location, rank: int,
               state: bytes | None) -> Callable[[], Persisted]:
    """``persist``, then this rank's state file written and added to what it persisted."""
    if state is None:
        return persist

    def persisted() -> Persisted:
        done = persist()
        return done._replace(records=[*done.records, write_state(target, rank, state)])

    return persisted


def read_state(checkpoint: Location, rank: int) -> bytes | None:
    """This rank's state file in a committed checkpoint; None where it has none."""
    location = checkpoint.join(state_name(rank))
    if files.file_type(location) != pyarrow.fs.FileType.File:
        return None
    return files.read_bytes(location)
