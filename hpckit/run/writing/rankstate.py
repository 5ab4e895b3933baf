"""The ranks' resume states (each rank's random streams and loaders' positions, as bytes the
session gives) kept as files of the checkpoint they go with: one file a node,
``.hpckit-resume/node-NNNNN`` named by the node's first rank (its leader), which writes its
node's states beside its own share, as the node leaders write a checkpoint's records. So a
checkpoint creates a file a node, not a rank (102,400 ranks in nodes of 8: 12,800). It is
recorded like any file, so that it is committed, verified, exported and deleted with the
checkpoint. Names under that folder in a handed or in-place directory are hpckit's, never
the user's: listings leave them out. A checkpoint written before states went by node holds
``rank-NNNNN`` files, read as they are."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence

import pyarrow.fs

from hpckit import faults
from hpckit.experiment.manifest import RANK_STATE_DIR, FileRecord
from hpckit.run.writing.plan import Persisted
from hpckit.storage import files
from hpckit.storage.copy import checksum_of
from hpckit.storage.location import Location

PART = "node-"
_FT = pyarrow.fs.FileType


def state_name(leader: int) -> str:
    """The file of the states of the node whose first rank is ``leader``."""
    return f"{RANK_STATE_DIR}/{PART}{leader:05d}"


def node_states(members: Sequence[int], states: Sequence[bytes | None]) -> bytes | None:
    """The file of a node's states: its ranks' (``members``, in the node's order), where
    they have one; None where none has."""
    kept = {rank: state for rank, state in zip(members, states, strict=True) if state is not None}
    return pickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL) if kept else None


def write_state(target: Location, leader: int, data: bytes) -> FileRecord:
    """``data`` written durably into checkpoint ``target`` as the node's states file."""
    name = state_name(leader)
    if target.is_local:  # object storage has no directories (a marker object would be one more)
        files.make_dir(target.join(RANK_STATE_DIR))
    files.write_atomic(target.join(name), data)
    faults.reached("resume_state", leader)
    return FileRecord(name, len(data), leader, checksum_of(data))


def with_state(persist: Callable[[], Persisted], target: Location, rank: int,
               state: bytes | None) -> Callable[[], Persisted]:
    """``persist``, then the node's states file written (on its leader, where ``state`` is
    not None) and added to what it persisted."""
    if state is None:
        return persist

    def persisted() -> Persisted:
        done = persist()
        return done._replace(records=[*done.records, write_state(target, rank, state)])

    return persisted


def read_state(checkpoint: Location, rank: int, leader: int) -> bytes | None:
    """``rank``'s state in a committed checkpoint: from its node's file (``leader``: its
    node's first rank now); where the ranks lay on other nodes when it was written, from the
    file that holds it; None where none does."""
    found = _part(checkpoint.join(state_name(leader)))
    if rank in found:
        return found[rank]
    listed = files.list_dir(checkpoint.join(RANK_STATE_DIR))
    names = sorted(i.base_name for i in listed if i.type == _FT.File)
    if f"rank-{rank:05d}" in names:  # written before the states went by node
        return files.read_bytes(checkpoint.join(RANK_STATE_DIR, f"rank-{rank:05d}"))
    for name in names:
        if name.startswith(PART) and name != state_name(leader).rsplit("/", 1)[1]:
            part = _part(checkpoint.join(RANK_STATE_DIR, name))
            if rank in part:
                return part[rank]
    return None


def _part(location: Location) -> dict[int, bytes]:
    if files.file_type(location) != _FT.File:
        return {}
    found = pickle.loads(files.read_bytes(location))
    return found if isinstance(found, dict) else {}
