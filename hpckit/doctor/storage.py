"""The storage path (writable, and the same directory on every rank, as ``fit()`` checks) and
the node-local cache directory."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from typing import TYPE_CHECKING

import pyarrow.fs

from hpckit.doctor.finding import FAIL, INFO, OK, Finding
from hpckit.errors import HpckitError
from hpckit.run.mpi.waiting import from_root, gather_to_root
from hpckit.storage import files
from hpckit.storage.location import Location

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

MARKER = ".hpckit-doctor-"


def shared_storage(comm: Comm, location: Location) -> Finding | None:
    """Rank 0 writes a marker at ``location``; every rank must see it. The finding on rank 0."""
    marker, error = None, None
    if comm.rank == 0:
        marker, error = _leave_marker(location)
    marker, error = from_root(comm, (marker, error))
    if error is not None:
        return Finding("storage", FAIL, f"rank 0 cannot write {location.display}: {error}",
                       "choose a storage path this user can write (RunConfig(storage_path), "
                       "HPCKIT_STORAGE, or --storage)") if comm.rank == 0 else None
    seen = gather_to_root(comm, (_sees(location.join(marker)), socket.gethostname()))
    if comm.rank != 0 or seen is None:
        return None
    _remove(location.join(marker))
    blind = [(rank, host) for rank, (sees, host) in enumerate(seen) if not sees]
    if blind:
        rank, host = blind[0]
        return Finding("storage", FAIL, f"{location.display}: rank {rank} on {host} cannot see "
                       f"the file rank 0 wrote there ({len(blind)} rank(s) in all)",
                       "use a filesystem every node shares (Lustre, NFS) or S3; a node-local "
                       "path such as /tmp is a different directory on every node")
    return Finding("storage", OK, f"{location.display}: writable, the same directory on "
                   f"all {len(seen)} rank(s)")


def _leave_marker(location: Location) -> tuple[str, str | None]:
    marker = f"{MARKER}{uuid.uuid4().hex}"
    try:
        if location.is_local:
            files.make_dir(location)
        files.write_bytes(location.join(marker), b"")
    except HpckitError as exc:
        return marker, str(exc)
    return marker, None


def _sees(marker: Location) -> bool:
    try:
        return bool(files.file_type(marker) == pyarrow.fs.FileType.File)
    except HpckitError:
        return False


def _remove(marker: Location) -> None:
    try:
        files.delete_file(marker, missing_ok=True)
    except HpckitError:
        pass  # a stray marker is harmless: hpckit gc ignores what is not an experiment


def cache_dir(comm: Comm, path: str | None) -> Finding | None:
    """CheckpointConfig(cache_dir=...): present and writable on every node."""
    problem = None if path is None else _cache_problem(path)
    found = gather_to_root(comm, (problem, socket.gethostname()))
    if comm.rank != 0 or found is None:
        return None
    if path is None:
        return Finding("node-local cache", INFO, "none given (--cache-dir checks one)")
    bad = [(rank, host, why) for rank, (why, host) in enumerate(found) if why]
    if bad:
        rank, host, why = bad[0]
        return Finding("node-local cache", FAIL, f"{path}: rank {rank} on {host}: {why} "
                       f"({len(bad)} rank(s) in all)", "create it on every node in the job "
                       "script (mkdir -p), or name a node-local disk that every node has "
                       "(/tmp, $TMPDIR, /local/scratch)")
    return Finding("node-local cache", OK, f"{path}: writable on all {len(found)} rank(s)")


def _cache_problem(path: str) -> str | None:
    if not os.path.isdir(path):
        return "no such directory"
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=MARKER):
            pass
    except OSError as exc:
        return f"not writable ({exc.strerror})"
    return None
