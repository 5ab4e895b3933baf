"""What a rank hands to ``report()``, where its files wait for the background, and where a
checkpoint is written in place.

An asynchronous ``report()`` returns as soon as the handed files are out of the user's way:
moved (a rename, when hpckit may take them) or copied into a staging directory, on the handed
directory's filesystem when one of the staging directories is there, so that the user may
delete or rewrite the handed directory at once. Staging directories belong to this rank:
``{experiment}/.staging/rank-N`` on POSIX storage (a later rename into the checkpoint then
costs nothing) and ``{local dir}/hpckit-staging/{experiment key}/rank-N``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpckit import faults
from hpckit.checkpoint import Checkpoint, location_of, wait_until_written
from hpckit.config import CheckpointUploadMode
from hpckit.errors import CheckpointError
from hpckit.experiment import journal, ownership
from hpckit.experiment.journal import Journal
from hpckit.experiment.manifest import RESERVED_NAMES, STAGING_NAME
from hpckit.experiment.ownership import inside
from hpckit.logs import log
from hpckit.run.writing.shares import check_returned, list_source, local_source
from hpckit.storage.location import Location
from hpckit.writes import written_later


@dataclass(frozen=True)
class Upload:
    """How one ``report()`` hands its checkpoint over."""

    mode: CheckpointUploadMode = CheckpointUploadMode.SYNC
    delete_local: bool = False
    dir_name: str | None = None
    validation: dict[str, Any] | None = None  # ValidationConfig.task(): rank 0's decides
    upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None  # checkpoint_upload_fn
    rank_state: Callable[[], bytes | None] | None = None  # this rank's resume state, if any
    keeps: bool = False  # whether it has one to keep (keepers registered)


@dataclass(frozen=True)
class Handed:
    """What this rank hands in at one report."""

    checkpoint: Checkpoint | None = None
    source: str | None = None
    files: list[tuple[str, int]] | None = None
    in_place: bool = False
    owned: bool = False
    """Whether hpckit may move the files and remove the directory."""
    later: tuple[str, ...] = ()
    """Files of an in-place checkpoint that this rank's saves are still writing."""
    upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None
    """``checkpoint_upload_fn``: it uploads the files straight into the checkpoint's directory."""
    pinned: bool = False
    """``source`` is this rank's links to a committed checkpoint's files (``writer.pinned``),
    removed once they are read."""


def hand_in(checkpoint: Checkpoint, upload: Upload, rank: int, pending: str,
            experiment: Location) -> Handed:
    """What this rank hands in: its directory written in place (``pending``), a directory of
    its own, listed, or a checkpoint its ``checkpoint_upload_fn`` will upload. Refuses what
    ``report()`` must not take."""
    if upload.upload_fn is not None and upload.mode is not CheckpointUploadMode.NO_UPLOAD:
        return _for_upload(checkpoint, upload, rank, experiment)
    source = local_source(checkpoint, rank)
    in_place = os.path.realpath(source) == os.path.realpath(pending)
    if not in_place and inside(source, pending):
        raise CheckpointError(
            f"rank {rank}: report() was handed {source}, inside the pending checkpoint "
            f"{pending}; hand get_context().get_checkpoint_dir() itself.")
    if upload.mode is CheckpointUploadMode.NO_UPLOAD and not in_place:
        raise CheckpointError(
            f"rank {rank}: report(checkpoint_upload_mode=NO_UPLOAD) takes the files already in "
            f"get_context().get_checkpoint_dir() ({pending}), not {source}; write them there, "
            f"or use SYNC or ASYNC to have {source} persisted.")
    if not in_place:
        refuse_experiments_own(source, experiment, rank)
    if in_place:
        later = written_later(source)
        if upload.mode is not CheckpointUploadMode.ASYNC:
            wait_until_written(checkpoint)
        return Handed(checkpoint, source, None, True, later=later)
    wait_until_written(checkpoint)
    # Files inside the experiment (a pending checkpoint before the first manifest) are never
    # hpckit's to move or delete; nor are any experiment's (ownership.why_kept).
    owned = upload.delete_local and not (
        experiment.is_local and inside(source, experiment.path)) and deletable(source, rank)
    return Handed(checkpoint, source, list_source(source, rank), owned=owned)


def refuse_experiments_own(source: str, experiment: Location, rank: int) -> None:
    """A handed directory that holds the storage path (and so the experiment), or that lies
    in one of the experiment's own directories (its staging, artifacts, logs, records):
    persisting it would nest the experiment in its own checkpoints, its lock and manifest
    among the files. A committed checkpoint handed again stays allowed."""
    if not experiment.is_local:
        return
    if inside(experiment.path, source):
        root = experiment.parent.path
        what = (f"the storage path {root} and its experiment {experiment.path}"
                if inside(root, source) else f"the experiment {experiment.path} itself")
        raise CheckpointError(
            f"rank {rank}: report() was handed {source}, which holds {what}: each checkpoint "
            "would hold the experiment, its manifest and every earlier checkpoint. Save the "
            "checkpoint into a directory of its own, such as tempfile.mkdtemp(), or "
            "get_context().get_checkpoint_dir().")
    if inside(source, experiment.path):
        own = os.path.relpath(os.path.realpath(source),
                              os.path.realpath(experiment.path)).split(os.sep)[0]
        if own in RESERVED_NAMES or own.startswith("."):
            raise CheckpointError(
                f"rank {rank}: report() was handed {source}, inside the experiment's own "
                f"{own}/ in {experiment.path}, which hpckit writes and removes. Save the "
                "checkpoint into a directory of its own, such as tempfile.mkdtemp(), or "
                "get_context().get_checkpoint_dir().")


def _for_upload(checkpoint: Checkpoint, upload: Upload, rank: int, experiment: Location
                ) -> Handed:
    """A checkpoint for ``checkpoint_upload_fn`` (not called for ``NO_UPLOAD``, as in Ray):
    hpckit reads none of its files; ``delete_local`` removes its local directory once the
    upload returned, unless it lies in the experiment."""
    if not isinstance(checkpoint, Checkpoint):
        raise CheckpointError(f"rank {rank}: report(checkpoint={checkpoint!r}) must be an "
                              "hpckit.Checkpoint, which checkpoint_upload_fn is then given.")
    local = location_of(checkpoint).is_local
    owned = upload.delete_local and local and not (
        experiment.is_local and inside(checkpoint.path, experiment.path)) and deletable(
            checkpoint.path, rank)
    return Handed(checkpoint, in_place=True, owned=owned, upload_fn=upload.upload_fn)


def upload(handed: Handed, target: Location, rank: int) -> None:
    """Run this rank's ``checkpoint_upload_fn`` into ``target`` (made first on POSIX
    storage) and check what it returns."""
    if handed.upload_fn is None or handed.checkpoint is None:
        return
    if target.is_local:
        os.makedirs(target.path, exist_ok=True)
    try:
        returned = handed.upload_fn(handed.checkpoint, target.name)
    except Exception as exc:
        raise CheckpointError(
            f"rank {rank}: checkpoint_upload_fn({handed.checkpoint!r}, {target.name!r}) raised "
            f"{type(exc).__name__}: {exc}") from exc
    check_returned(returned, target, rank)


def release(handed: Handed, shared_in_place: bool) -> None:
    """After a synchronous commit: remove the handed directory when it is hpckit's to remove
    (a local staging directory written in place, or as ``delete_local`` says, an uploaded
    one's included)."""
    uploaded = uploaded_taken(handed)
    if uploaded is not None:
        uploaded.committed()
    if handed.source is None or (handed.in_place and shared_in_place):
        return
    if handed.in_place or handed.pinned:  # hpckit's own staging
        shutil.rmtree(handed.source, ignore_errors=True)
    elif handed.owned:
        ownership.remove_taken(handed.source, [name for name, _ in handed.files or []])


def uploaded_taken(handed: Handed, rank: int = 0) -> Taken | None:
    """What ``delete_local`` takes of a directory that ``checkpoint_upload_fn`` uploaded:
    removed once the checkpoint commits, never before (its upload alone is no commit)."""
    if handed.upload_fn is None or not handed.owned or handed.checkpoint is None:
        return None
    path = handed.checkpoint.path
    return Taken(path, None, None, tuple(ownership.names_in(path)), rank)


def deletable(directory: str, rank: int) -> bool:
    """Whether hpckit may delete a handed directory as ``delete_local`` says (Ray's default
    for ASYNC): never one that holds the current directory, where ``Checkpoint.from_directory
    (".")`` would take the user's working tree (their code, a git repository) with it, nor
    any the ownership rule keeps."""
    kept = ownership.why_kept(directory)
    if kept is None:
        return True
    log.warning("rank %d: report() was handed %s, %s; it is not deleted after the checkpoint "
                "is persisted (delete_local_checkpoint_after_upload): hand a directory of its "
                "own, such as tempfile.mkdtemp()", rank, directory, kept)
    return False


@dataclass(frozen=True)
class Staging:
    """This rank's staging directories for one experiment, best first."""

    experiment: Location
    rank: int
    local_dir: str | None

    @property
    def shared(self) -> str | None:
        """The staging directory inside the experiment (POSIX storage only)."""
        if not self.experiment.is_local:
            return None
        return os.path.join(self.experiment.path, STAGING_NAME, f"rank-{self.rank}")

    @property
    def local(self) -> str:
        key = hashlib.sha256(self.experiment.display.encode()).hexdigest()[:12]
        root = self.local_dir or tempfile.gettempdir()
        return os.path.join(root, "hpckit-staging", f"{self.experiment.name}-{key}",
                            f"rank-{self.rank}")

    def in_place_path(self, directory: str) -> str:
        """Where this rank writes checkpoint ``directory`` in place: the pending checkpoint
        itself on POSIX storage (shared by every rank), else a local directory of its own."""
        if self.experiment.is_local:
            return self.experiment.join(directory).path
        return os.path.join(self.local, "in-place", directory)

    def in_place(self, directory: str) -> str:
        """:meth:`in_place_path`, created."""
        path = self.in_place_path(directory)
        os.makedirs(path, exist_ok=True)
        return path

    def for_files(self, source: str, directory: str) -> str:
        """A fresh staging directory for ``directory``'s files, on ``source``'s filesystem
        where a staging directory can be, else the first that can be made. Where a journal
        still names that directory (an earlier attempt's files that could not go back, kept
        for the user), another name beside it."""
        device = os.stat(source).st_dev
        made = []
        for root in (self.shared, self.local):
            if root is None:
                continue
            try:
                os.makedirs(root, exist_ok=True)
            except OSError:
                continue
            made.append(root)
            if os.stat(root).st_dev == device:
                break
        if not made:
            tried = " or ".join(root for root in (self.shared, self.local) if root)
            raise OSError(errno.EACCES, f"rank {self.rank}: no staging directory could be made "
                          f"for {source} in {tried}; make one of them writable, or set "
                          "HPCKIT_LOCAL_DIR to a writable local path")
        staged = os.path.join(made[-1], directory)
        if any(os.path.lexists(staged + suffix) for suffix in (journal.SUFFIX, journal.UNSETTLED)):
            staged = os.path.join(made[-1], f"{directory}-{uuid.uuid4().hex[:12]}")
        shutil.rmtree(staged, ignore_errors=True)
        os.makedirs(staged)
        return staged

    def pin(self, source: str, names: list[str]) -> str:
        """A fresh staging directory of hard links to ``names`` in ``source`` (copies where
        the filesystem has no links), which only this rank reads, then releases."""
        pin = self.for_files(source, f"pinned-{uuid.uuid4().hex[:12]}")
        for name in names:
            original, link = os.path.join(source, name), os.path.join(pin, name)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            try:
                os.link(original, link)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                shutil.copyfile(original, link)
        return pin

    def release(self, staged: str) -> None:
        """A staged (or local in-place) directory whose files are persisted."""
        shutil.rmtree(staged, ignore_errors=True)

    def remove(self) -> None:
        """Everything this rank staged (at the end of its attempt, and at the start of the
        next), but the journals of hand-overs still to settle, with what they staged
        (:func:`journal.replay`)."""
        for root in (self.shared, self.local):
            if root is None:
                continue
            journals = [os.path.basename(path) for path in journal.found([os.path.dirname(root)])
                        if os.path.dirname(path) == root]
            if not journals:
                shutil.rmtree(root, ignore_errors=True)
            kept = set(journals) | {name.split(journal.SUFFIX)[0] for name in journals}
            for name in set(_entries(root)) - kept if journals else ():
                path = os.path.join(root, name)
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
            with contextlib.suppress(OSError):  # the last rank out removes the parent
                os.rmdir(os.path.dirname(root))

    def put_back_local(self, next_index: int) -> None:
        """Put back what the hand-overs of an earlier attempt left in this node's staging,
        every rank's, where their checkpoints did not commit (``next_index``: the manifest's);
        one rank of each node, before any rank removes its staging. The experiment's own
        staging is rank 0's, at the opening (``leftovers.put_back_handed``)."""
        root = os.path.dirname(self.local)
        if os.path.isdir(root):
            journal.replay([root], next_index)


@dataclass(frozen=True)
class Taken:
    """What one asynchronous report took of a handed directory, until its checkpoint commits
    or is given up: the files moved into ``staged`` (with the ``journal`` written before the
    first move) and, where hpckit may remove the handed files, those copied, to remove once
    the checkpoint holding them committed (a directory other ranks hand too, say)."""

    source: str
    staged: str | None
    journal: Journal | None
    remove_after: tuple[str, ...] | None  # None: none of the handed files is hpckit's to remove
    rank: int

    def committed(self) -> None:
        """The checkpoint committed: its files are its own; the handed ones that were copied
        go now, and the staging with the journal."""
        if self.remove_after is not None:
            ownership.remove_taken(self.source, list(self.remove_after))
        if self.staged is not None:
            shutil.rmtree(self.staged, ignore_errors=True)
        if self.journal is not None:
            self.journal.discard()

    def abandoned(self, why: str) -> None:
        """The checkpoint will not commit: every moved file goes back where it was. Where
        one cannot, the journal and the staged files stay, marked (:func:`journal.replay`)."""
        if self.journal is not None:
            try:
                self.journal.put_back(why, self.rank)
            except OSError as exc:
                journal.keep_unsettled(self.journal.path, exc)
                return
            self.journal.discard()
        if self.staged is not None:
            shutil.rmtree(self.staged, ignore_errors=True)


def hand_over(source: str, staged: str, writes: list[str], hashes: list[str], owned: bool,
              shared: set[str], directory: str, index: int, rank: int) -> Taken:
    """Put this rank's files (relative to ``source``) into ``staged``, for a checkpoint that
    commits later. Where hpckit owns them (``owned``), the files this rank writes and no
    other rank hands (``shared``: a directory several ranks hand is never moved from) are
    renamed, all or none: only once every one can be renamed and unlinked (the ownership
    rule, each directory's permissions and sticky bit, one filesystem), and only after the
    journal of the move is written. Everything else is copied. A failure puts back what was
    moved; what is copied of an owned directory goes once the checkpoint commits."""
    takeable = [rel for rel in writes if rel not in shared] if owned else []
    why = _cannot_move(source, takeable, os.path.dirname(staged)) if takeable else None
    if why is not None:
        log.debug("rank %d: %s: its files are copied, not moved", rank, why)
    moving = takeable if why is None else []
    record = (Journal.before_moving(source, staged, directory, index, moving) if moving
              else None)
    moved = _moved(source, staged, moving, record, rank)
    try:
        for rel in [r for r in hashes + writes if r not in moved]:
            dst = os.path.join(staged, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            _copy(os.path.join(source, rel), dst)
    except BaseException:
        if record is not None:
            record.put_back("the hand-over failed", rank)
            record.discard()
        raise
    if moved:
        ownership.prune(source, moved)
    kept = tuple(rel for rel in hashes + writes if rel not in moved) if owned else None
    return Taken(source, staged, record if moved else None, kept, rank)


def _moved(source: str, staged: str, names: list[str], record: Journal | None,
           rank: int) -> list[str]:
    """Rename ``names`` into ``staged``; if one fails, every one goes back (and the caller
    copies them all instead)."""
    try:
        for rel in names:
            dst = os.path.join(staged, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            _rename(os.path.join(source, rel), dst, rank)
    except BaseException as exc:
        if record is not None:
            record.put_back(f"moving {source}'s files into staging failed ({exc!r})", rank)
            record.discard()
        if not isinstance(exc, OSError):
            raise
        return []
    return names


def _rename(src: str, dst: str, rank: int) -> None:
    """One file of the hand-over moved (the fault point ``taking`` follows each)."""
    os.rename(src, dst)
    faults.reached("taking", rank)


def _copy(src: str, dst: str) -> None:
    shutil.copyfile(src, dst)


def _cannot_move(source: str, names: list[str], staging: str) -> str | None:
    """Why ``names`` cannot all be moved out of ``source`` into ``staging`` and unlinked
    there, or None: the ownership rule, then for each file its directory's write and search
    permission, the sticky bit (only the file's or the directory's owner may remove it),
    and one filesystem for a rename."""
    device = os.stat(staging).st_dev
    uid = os.geteuid()
    for rel in names:
        if not ownership.may_take(source, rel):
            return f"{rel} in {source} is not hpckit's to move"
        path = os.path.join(source, rel)
        parent = os.path.dirname(path)
        try:
            status, holder = os.lstat(path), os.stat(parent)
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        if status.st_dev != device:
            return f"{source} is on another filesystem than the staging directory {staging}"
        if not os.access(parent, os.W_OK | os.X_OK, effective_ids=True):
            return f"{parent} is not writable"
        if holder.st_mode & stat.S_ISVTX and uid not in (0, status.st_uid, holder.st_uid):
            return f"{path} is another user's, in a directory with the sticky bit"
    return None


def _entries(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def same_filesystem(path: str, target: Location) -> bool:
    """Whether files at ``path`` can be renamed into ``target`` (local storage, one device)."""
    if not target.is_local:
        return False
    parent = target.path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return os.stat(path).st_dev == os.stat(parent).st_dev
