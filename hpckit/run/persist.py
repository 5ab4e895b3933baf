"""One rank's part of a checkpoint: the files it hands in, and persisting those the plan
assigns to it (hashing the others it holds, so that duplicates can be compared)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hpckit import faults
from hpckit.checkpoint import Checkpoint
from hpckit.errors import CheckpointError
from hpckit.experiment.manifest import FileRecord, is_safe_relpath
from hpckit.run.plan import Plan
from hpckit.storage.copy import fsync_tree, persist_file, progress, sha256_file
from hpckit.storage.location import Location

PARALLEL_FILES = 8


def local_source(checkpoint: Any, rank: int) -> str:
    """The local directory of a checkpoint handed to ``report()``."""
    if not isinstance(checkpoint, Checkpoint):
        raise CheckpointError(
            f"rank {rank}: report(checkpoint={checkpoint!r}) must be an hpckit.Checkpoint, e.g. "
            "Checkpoint.from_directory(tmpdir).")
    if not checkpoint._location.is_local:
        raise CheckpointError(
            f"rank {rank}: report() persists local files, but {checkpoint!r} is remote; download "
            "it first (checkpoint.to_directory()) or hand a local directory.")
    checkpoint._require_dir()
    return checkpoint.path


def list_source(source: str, rank: int) -> list[tuple[str, int]]:
    """Every file of a handed directory as (relative POSIX path, size)."""
    found = []
    for parent, _, names in os.walk(source, followlinks=True):
        for name in names:
            full = os.path.join(parent, name)
            rel = os.path.relpath(full, source).replace(os.sep, "/")
            if not is_safe_relpath(rel):
                raise CheckpointError(f"rank {rank}: checkpoint file name {rel!r} in {source} is "
                                      "not a plain relative path; rename it.")
            if not os.path.isfile(full):
                raise CheckpointError(f"rank {rank}: {full} is not a regular file (a broken "
                                      "link or a socket?); remove it from the checkpoint directory.")
            found.append((rel, os.path.getsize(full)))
    return sorted(found)


def persist(plan: Plan, target: Location, source: str | None, rank: int) -> list[FileRecord]:
    """Write this rank's assigned files into ``target`` durably, hash its duplicates."""
    writes, hashes = plan.writes.get(rank, []), plan.hashes.get(rank, [])
    if not writes and not hashes:
        return []
    assert source is not None, "the plan assigns files only to ranks that handed some"

    def one(rel: str) -> FileRecord:
        src = os.path.join(source, rel)
        if rel not in writes:
            size, digest = sha256_file(src)
            return FileRecord(rel, size, rank, digest)
        size, digest = persist_file(src, target.join(rel))
        faults.reached("writing", rank)
        return FileRecord(rel, size, rank, digest)

    sizes = {rel: os.path.getsize(os.path.join(source, rel)) for rel in writes}
    with progress(sum(sizes.values()), f"rank {rank}: writing {target.name}") as bar, \
            ThreadPoolExecutor(max(1, min(PARALLEL_FILES, len(writes) + len(hashes)))) as pool:
        records = []
        for record in pool.map(one, writes + hashes):
            records.append(record)
            bar.update(sizes.get(record.path, 0))
    if writes and target.is_local:
        fsync_tree(target.path, writes)
    return records
