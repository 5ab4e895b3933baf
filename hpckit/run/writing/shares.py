"""One rank's part of a checkpoint: the files it hands in, and persisting those the plan
assigns to it (hashing the others it holds, so that duplicates can be compared); or, for a
checkpoint written in place or uploaded by ``checkpoint_upload_fn``, hashing and syncing its
share of what is already there.

``report(checkpoint_upload_fn=fn)``, as in Ray 2.60: each rank's ``fn(checkpoint,
checkpoint_dir_name)`` uploads its files itself, straight into the checkpoint's directory in
the experiment, in place of hpckit's copy, and returns a checkpoint of that directory.

hpckit cannot know when another rank's upload is done, so the ranks meet once every rank's
``fn`` has returned: only then is the directory complete, and every rank lists the same
files. Each rank then hashes its share of them where they lie (read back from object
storage), and the checkpoint is committed as one written in place. With ``ASYNC`` all of it
runs on the in-flight thread, and the ranks meet there, on a communicator of their own.
Here: the check of what ``fn`` returns, and the meeting (``staging.upload`` calls ``fn``,
``writer.ShareWriter`` runs the steps, ``shares.hash_uploaded`` hashes).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

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
from hpckit.run.mpi.comm import BackgroundComm
from hpckit.run.mpi.waiting import wait_for_all
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


if TYPE_CHECKING:
    from mpi4py.MPI import Comm

BACKGROUND_LOOKS = 0.05  # seconds at most between a background meeting's looks


def check_returned(returned: Any, target: Location, rank: int) -> None:
    """The checkpoint ``checkpoint_upload_fn`` returned is ``target``, on the experiment's
    storage (Ray requires it inside the run's storage; hpckit commits that directory)."""
    if not isinstance(returned, Checkpoint):
        raise CheckpointError(f"rank {rank}: checkpoint_upload_fn returned {returned!r}; it must "
                              "return a Checkpoint, as in Ray.")
    if not _same_place(location_of(returned), target):
        how = ("Checkpoint.from_directory() of it" if target.is_local else
               "Checkpoint(path, get_context().get_storage_filesystem()) of it")
        raise CheckpointError(
            f"rank {rank}: checkpoint_upload_fn returned a checkpoint at {returned.uri}, "
            f"outside this checkpoint's directory in the experiment; upload into "
            f"{target.display} (the checkpoint_dir_name it is given, under "
            f"get_context().get_experiment_path()) and return {how}.")


def _same_place(where: Location, target: Location) -> bool:
    if where.is_local or target.is_local:
        return (where.is_local and target.is_local
                and os.path.realpath(where.path) == os.path.realpath(target.path))
    return (_service(where) == _service(target)
            and where.path.strip("/") == target.path.strip("/"))


def _service(location: Location) -> tuple[str, str]:
    """The kind of storage and, for S3, its endpoint (among the options pyarrow pickles)."""
    filesystem = location.filesystem
    reduced = filesystem.__reduce__()
    options = reduced[1][0] if len(reduced) > 1 and reduced[1] else {}
    endpoint = options.get("endpoint_override", "") if isinstance(options, dict) else ""
    return filesystem.type_name, str(endpoint)


class Meeting:
    """Where the ranks wait, each after its ``checkpoint_upload_fn``, until every rank's has
    returned: inside ``report()`` on its communicator, in the background on a duplicate."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        self._background = BackgroundComm()
        self._asked = False

    def in_background(self) -> bool:
        """Whether the ranks can meet on the in-flight thread. The first call makes its
        communicator: collective, on the training thread, at the same report on every rank."""
        if not self._asked:
            self._asked = True
            self._background.open(self.comm)
        return self._background.comm is not None

    def meet(self, background: bool) -> None:
        if background:  # maybe long (another rank's upload): the training thread keeps the GIL
            if self._background.comm is None:
                raise ProtocolError("a meeting in the background before in_background() said "
                                    "the ranks can meet there")
            wait_for_all(self._background.comm, check=self._go_on, longest=BACKGROUND_LOOKS)
        else:
            wait_for_all(self.comm)

    def _go_on(self) -> None:
        if self._background.abandoned.is_set():
            raise CheckpointError(
                f"rank {self.comm.rank}: waiting for the other ranks' checkpoint_upload_fn was "
                "abandoned: the attempt ended (a rank may be gone); the next attempt starts "
                "afresh")

    def abandon(self) -> None:
        """The attempt ends: a background wait still under way stops."""
        self._background.abandon()

    def release(self) -> None:
        """Collective, after the last upload of an attempt that ended well."""
        self._background.release()
