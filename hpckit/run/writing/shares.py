"""One rank's part of a checkpoint: the files it hands in, and persisting those the plan
assigns to it (hashing the others it holds, so that duplicates can be compared); or, for a
checkpoint written in place or uploaded by ``checkpoint_upload_fn``, hashing and syncing its
share of what is already there."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hpckit import faults
from hpckit.checkpoint import Checkpoint, location_of, require_directory
from hpckit.errors import CheckpointError, ProtocolError
from hpckit.experiment.manifest import (
    PENDING_MARKER,
    FileRecord,
    is_rank_state,
    is_records_part,
    is_safe_relpath,
)
from hpckit.logs import log
from hpckit.run.writing.plan import Persisted, Plan
from hpckit.storage import files
from hpckit.storage.copy import checksum_file, checksum_stored, fsync_tree, persist_file, progress
from hpckit.storage.location import Location, local

PARALLEL_FILES = 8


def local_source(checkpoint: Any, rank: int) -> str:
    """The local directory of a checkpoint handed to ``report()``."""
    if not isinstance(checkpoint, Checkpoint):
        raise CheckpointError(
            f"rank {rank}: report(checkpoint={checkpoint!r}) must be an hpckit.Checkpoint, e.g. "
            "Checkpoint.from_directory(tmpdir).")
    if not location_of(checkpoint).is_local:
        raise CheckpointError(
            f"rank {rank}: report() persists local files, but {checkpoint!r} is remote; download "
            "it first (checkpoint.to_directory()) or hand a local directory.")
    require_directory(checkpoint)
    return checkpoint.path


def list_source(source: str, rank: int) -> list[tuple[str, int]]:
    """Every file of a handed directory as (relative POSIX path, size), but the ranks' resume
    states and the nodes' parts of its records (a committed checkpoint handed again: they are
    stale, and this one's are written anew)."""
    found = []
    for parent, _, names in os.walk(source, followlinks=True):
        for name in names:
            full = os.path.join(parent, name)
            rel = os.path.relpath(full, source).replace(os.sep, "/")
            if is_rank_state(rel) or is_records_part(rel):
                continue
            if not is_safe_relpath(rel):
                raise CheckpointError(f"rank {rank}: checkpoint file name {rel!r} in {source} is "
                                      "not a plain relative path; rename it.")
            if not _utf8(rel):
                raise CheckpointError(
                    f"rank {rank}: checkpoint file name {rel!r} in {source} is not UTF-8 (the "
                    "manifest records names as text, and S3 keys are UTF-8); rename it.")
            if not os.path.isfile(full):
                raise CheckpointError(f"rank {rank}: {full} is not a regular file (a broken "
                                      "link or a socket?); remove it from the checkpoint directory.")
            found.append((rel, os.path.getsize(full)))
    return sorted(found)


def _utf8(name: str) -> bool:
    """Whether a name read from the filesystem is text: undecodable bytes arrive as lone
    surrogates (Python's surrogateescape), which no manifest or S3 key can hold."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def write_share(plan: Plan, target: Location, source: str | None, rank: int, *, link: bool = False,
            phase: str = "writing") -> list[FileRecord]:
    """Write this rank's assigned files into ``target`` durably, hash its duplicates. With
    ``link`` (a staging directory on the target's filesystem) each file gets a second name
    in the checkpoint, synced, instead of a copy: the staged name stays until the checkpoint
    commits, so that a hand-over that does not commit can still put the file back (and the
    cleanup of an uncommitted checkpoint never removes the only one). ``phase`` is the fault
    point met after the first file."""
    writes, hashes = plan.writes.get(rank, []), plan.hashes.get(rank, [])
    if not writes and not hashes:
        return []
    if source is None:
        raise ProtocolError(f"rank {rank}: the plan of {target.name} assigns it files "
                            f"({(writes + hashes)[0]}, ...) but it handed none")

    def one(rel: str) -> FileRecord:
        src = os.path.join(source, rel)
        if rel not in writes:
            size, digest = checksum_file(src)
            return FileRecord(rel, size, rank, digest)
        if link:
            size, digest = _link(src, target.join(rel).path)
        else:
            size, digest = persist_file(src, target.join(rel))
        faults.reached(phase, rank)
        return FileRecord(rel, size, rank, digest)

    sizes = {rel: os.path.getsize(os.path.join(source, rel)) for rel in writes}
    records = _each(one, writes + hashes, sizes, f"rank {rank}: writing {target.name}")
    if writes and target.is_local:
        fsync_tree(target.path, writes)
    return records


def sync_in_place(directory: str, target: Location, rank: int, ranks: int,
                  phase: str = "writing", later: dict[int, tuple[str, ...]] | None = None
                  ) -> Persisted:
    """A checkpoint written in place. On POSIX storage ``directory`` is the shared pending
    checkpoint: this rank hashes and syncs its share of the files every rank wrote there,
    and the files its own saves wrote after the report (``later``, by rank: another rank
    may still be writing its own). On object storage it is this rank's own staging
    directory, whose files it uploads."""
    listing = list_source(directory, rank)
    shared = target.is_local and os.path.realpath(directory) == os.path.realpath(target.path)
    mine = [name for name, _ in listing]
    if shared:
        claimed = {name: owner for owner, names in (later or {}).items() for name in names}
        common = [(name, size) for name, size in listing if name not in claimed]
        mine = share_hashing(common, ranks, rank) + sorted(
            name for name, owner in claimed.items() if owner == rank)

    def one(rel: str) -> FileRecord:
        if shared:
            size, digest = checksum_file(os.path.join(directory, rel), sync=True)
        else:
            size, digest = persist_file(os.path.join(directory, rel), target.join(rel))
        faults.reached(phase, rank)
        return FileRecord(rel, size, rank, digest)

    sizes = dict(listing)
    records = _each(one, mine, sizes, f"rank {rank}: persisting {target.name}")
    if shared:
        fsync_tree(target.path, [name for name, _ in listing])
    return Persisted(records, tuple(name for name, _ in listing) if shared else ())


def hash_uploaded(target: Location, rank: int, ranks: int, phase: str) -> Persisted:
    """This rank's share of what the uploads left in ``target``, hashed (and synced) where it
    lies: on object storage each object is read back."""
    listing = [(name, size) for name, size in files.list_files(target)
               if name != PENDING_MARKER and not is_rank_state(name)
               and not is_records_part(name)]
    for name, _ in listing:
        if not is_safe_relpath(name):
            raise CheckpointError(f"rank {rank}: checkpoint_upload_fn left {name!r} in "
                                  f"{target.display}, not a plain relative path; rename it.")

    def one(name: str) -> FileRecord:
        if target.is_local:
            size, digest = checksum_file(target.join(name).path, sync=True)
        else:
            size, digest = checksum_stored(target.join(name))
        faults.reached(phase, rank)
        return FileRecord(name, size, rank, digest)

    records = _each(one, share_hashing(listing, ranks, rank), dict(listing),
                    f"rank {rank}: hashing {target.name}")
    if target.is_local:
        fsync_tree(target.path, [name for name, _ in listing])
    return Persisted(records, tuple(name for name, _ in listing))


def _link(source: str, target: str) -> tuple[int, str]:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)  # an earlier attempt's name, which no manifest holds
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        return persist_file(source, local(target))
    return checksum_file(target, sync=True)


def _each(one: Callable[[str], FileRecord], names: list[str], sizes: dict[str, int],
          label: str) -> list[FileRecord]:
    """``one`` over ``names`` on a few threads, with a progress bar for the large ones."""
    if not names:
        return []
    with progress(sum(sizes.get(n, 0) for n in names), label) as bar, \
            ThreadPoolExecutor(max(1, min(PARALLEL_FILES, len(names)))) as pool:
        records = []
        for record in pool.map(one, names):
            records.append(record)
            bar.update(sizes.get(record.path, 0))
    return records


def share_hashing(listing: list[tuple[str, int]], ranks: int, rank: int) -> list[str]:
    """This rank's share of an in-place checkpoint's files: largest first to the least
    loaded rank, so every rank reading the same listing makes the same split."""
    loads = [0] * ranks
    mine = []
    for name, size in sorted(listing, key=lambda f: (-f[1], f[0])):
        least = loads.index(min(loads))
        loads[least] += size
        if least == rank:
            mine.append(name)
    return mine


def hash_late(target: Location, name: str) -> FileRecord:
    """Rank 0: a file of an in-place checkpoint that no rank's listing held, hashed."""
    log.debug("hashing %s on rank 0: no rank's listing of %s held it", name, target.name)
    if target.is_local:
        size, digest = checksum_file(os.path.join(target.path, name), sync=True)
    else:  # uploaded by checkpoint_upload_fn: read back
        size, digest = checksum_stored(target.join(name))
    return FileRecord(name, size, 0, digest)
