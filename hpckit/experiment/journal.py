"""The journal of a hand-over: what a rank moved out of a directory handed to ``report()``,
written down before the first move, so that taking is a transaction.

An asynchronous ``report()`` takes what it may of the handed directory (the ownership rule,
:mod:`hpckit.experiment.ownership`) into the rank's staging directory, a rename a file, so
that training goes on at once. Until the checkpoint that holds those files commits, they
exist only in staging, which a cleanup removes. So before the first rename the rank writes
this journal beside the staged files, on their filesystem, and syncs it. Any failure before
the commit puts every file back from it (:meth:`Journal.put_back`: the files, the
directories the hand-over removed, their modes and times); a rank killed meanwhile leaves
it, and the next start (or ``hpckit gc``) puts the files back before it removes anything
of the staging (:func:`replay`). Once the checkpoint commits, the files are the
checkpoint's and the journal goes with the staging. A file the checkpoint links (persisted
into it, and maybe committed after all, by rank 0's committer while the ranks failed) goes
back as a copy of its own, never as a second name of the checkpoint's file.

A journal is ``{staged directory}.hpckit-journal``, JSON, written whole (temp file, fsync,
rename, the directory synced); this module both writes and reads it, with its version.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import stat
from dataclasses import dataclass

from hpckit.logs import log
from hpckit.storage.files import fsync_dir

SUFFIX = ".hpckit-journal"
UNSETTLED = ".hpckit-journal-unsettled"  # its files could not be put back: never removed
FORMAT = "hpckit.handover"
VERSION = 1


@dataclass(frozen=True)
class Directory:
    """A directory of the handed tree as it was before the hand-over (``path`` relative to
    the handed directory, "" for itself)."""

    path: str
    mode: int
    atime_ns: int
    mtime_ns: int


@dataclass(frozen=True)
class PutBack:
    """What a put-back did: files back in place, files left where they were since a file
    of that name is there now (the user wrote it since), and files found nowhere."""

    back: int = 0
    superseded: int = 0
    missing: int = 0


@dataclass(frozen=True)
class Journal:
    source: str
    """The handed directory."""
    staged: str
    """Where its files wait: the staging directory of this checkpoint."""
    directory: str
    """The checkpoint's directory name."""
    index: int
    """The checkpoint's index: it committed once the manifest's next index is past it."""
    moved: tuple[str, ...]
    """The files moved, relative POSIX paths, in the order moved."""
    directories: tuple[Directory, ...]
    """The handed directory and each directory on a moved file's path, as they were."""

    @property
    def path(self) -> str:
        return self.staged.rstrip(os.sep) + SUFFIX

    @classmethod
    def before_moving(cls, source: str, staged: str, directory: str, index: int,
                      moved: list[str]) -> Journal:
        """The journal of moving ``moved`` out of ``source`` into ``staged``, written and
        synced: call it before the first move."""
        parents = {""} | {"/".join(name.split("/")[:i]) for name in moved
                          for i in range(1, name.count("/") + 1)}
        journal = cls(source, staged, directory, index, tuple(moved),
                      tuple(_as_it_is(source, p) for p in sorted(parents)))
        journal._write()
        return journal

    def _write(self) -> None:
        body = {"format": FORMAT, "version": VERSION, "source": self.source,
                "staged": self.staged, "directory": self.directory, "index": self.index,
                "moved": list(self.moved),
                "directories": [[d.path, d.mode, d.atime_ns, d.mtime_ns]
                                for d in self.directories]}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        temporary = self.path + ".tmp"
        with open(temporary, "w") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        fsync_dir(os.path.dirname(self.path))

    def put_back(self, why: str, rank: int | None = None) -> PutBack:
        """Every moved file back where it was (one already back, or never moved, is left),
        then the directories' modes and times as they were; says so in one line. A file of
        the same name that is there now (written since) is kept, and the staged one not
        put over it."""
        back = superseded = missing = 0
        for name in self.moved:
            staged, original = _join(self.staged, name), _join(self.source, name)
            if os.path.lexists(original):
                if os.path.lexists(staged):
                    superseded += 1
                continue
            if not os.path.lexists(staged):
                missing += 1
                continue
            self._make_parents(name)
            _give_back(staged, original)
            back += 1
        self._restore_directories()
        done = PutBack(back, superseded, missing)
        if back or superseded or missing:
            log.warning("%s%s: %s", f"rank {rank}: " if rank is not None else "", why,
                        _said(done, self.source))
        return done

    def discard(self) -> None:
        """The journal is done with (its checkpoint committed, or its files went back)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _make_parents(self, name: str) -> None:
        parts = name.split("/")[:-1]
        kept = {d.path: d for d in self.directories}
        for i in range(0, len(parts) + 1):
            relative = "/".join(parts[:i])
            path = _join(self.source, relative) if relative else self.source
            if not os.path.isdir(path):
                before = kept.get(relative)
                os.mkdir(path, 0o700)
                if before is not None:
                    os.chmod(path, stat.S_IMODE(before.mode) | stat.S_IWUSR | stat.S_IXUSR)

    def _restore_directories(self) -> None:
        for before in sorted(self.directories, key=lambda d: d.path.count("/") + bool(d.path),
                             reverse=True):
            path = _join(self.source, before.path) if before.path else self.source
            with contextlib.suppress(FileNotFoundError):
                if os.path.islink(path) or not os.path.isdir(path):
                    continue
                os.chmod(path, stat.S_IMODE(before.mode))
                os.utime(path, ns=(before.atime_ns, before.mtime_ns))


def _give_back(staged: str, original: str) -> None:
    """The staged file at ``original`` again: renamed, unless another name links it (the
    checkpoint it was persisted into, which may have committed after all): then a copy of
    its own takes its place, so that writing over the user's file never changes a
    checkpoint. The copy is made whole beside the staged file first: a kill meanwhile leaves
    it in the staging, which goes, never in the user's directory."""
    if os.lstat(staged).st_nlink <= 1:
        os.rename(staged, original)
        return
    temporary = f"{staged}.hpckit-copy"
    try:
        shutil.copy2(staged, temporary, follow_symlinks=False)
        os.rename(temporary, original)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    os.unlink(staged)


def _as_it_is(source: str, relative: str) -> Directory:
    status = os.stat(_join(source, relative) if relative else source)
    return Directory(relative, status.st_mode, status.st_atime_ns, status.st_mtime_ns)


def _join(root: str, name: str) -> str:
    return os.path.join(root, *name.split("/")) if name else root


def _said(done: PutBack, source: str) -> str:
    parts = [f"put {done.back} file(s) back into {source}"]
    if done.superseded:
        parts.append(f"{done.superseded} not, since a file of the same name is there now")
    if done.missing:
        parts.append(f"{done.missing} found neither there nor in staging")
    return "; ".join(parts)


def read(path: str) -> Journal | None:
    """The journal at ``path``; None where it is gone, or was cut short while it was written
    (then nothing was moved: the first move comes after it is whole)."""
    try:
        with open(path) as f:
            body = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError:
        return None
    if body.get("format") != FORMAT or body.get("version", 0) > VERSION:
        raise OSError(errno.EINVAL, f"{path} is not a hand-over journal this hpckit reads "
                      f"(format {body.get('format')!r}, version {body.get('version')!r})")
    return Journal(body["source"], body["staged"], body["directory"], int(body["index"]),
                   tuple(body["moved"]),
                   tuple(Directory(p, m, a, t) for p, m, a, t in body["directories"]))


def replay(roots: list[str], next_index: int) -> list[str]:
    """What earlier attempts left in the staging ``roots`` (each a folder of ``rank-N``
    staging directories): the files of every checkpoint that did not commit (its index is
    not below the manifest's ``next_index``) go back to their handed directories; the
    journals of those that did are dropped. Call it before anything of the staging is
    removed, with the manifest as the last attempt left it. A journal whose files cannot
    be put back is kept, marked unsettled, with its staging, which no cleanup removes;
    returns those, and says where they are."""
    journals: list[tuple[str, Journal | None]] = []
    for path in sorted(p for root in roots for p in _glob(root, SUFFIX)):
        try:
            journals.append((path, read(path)))
        except OSError as exc:
            keep_unsettled(path, exc)
    # Newest first, as a closing attempt puts back: where two hand-overs took one name, the
    # newer file is the user's, and the older one then finds it there.
    for path, journal in sorted(journals, key=lambda found: found[1].index if found[1] else -1,
                                reverse=True):
        try:
            if journal is not None and journal.index >= next_index:
                journal.put_back(f"checkpoint {journal.directory} of an earlier attempt did "
                                 "not commit")
        except OSError as exc:
            keep_unsettled(path, exc)
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    unsettled = sorted(p for root in roots for p in _glob(root, UNSETTLED))
    for path in unsettled:
        log.warning("%s records files of yours that hpckit moved for a checkpoint that never "
                    "committed and could not put back: they are in %s; move them back, then "
                    "delete the journal", path, path.removesuffix(UNSETTLED))
    return unsettled


def keep_unsettled(path: str, error: BaseException) -> None:
    """A journal whose files could not go back: kept, with its staged files, for the user."""
    log.error("could not put back the files that %s records (%s); they stay in %s", path,
              error, path.removesuffix(SUFFIX))
    with contextlib.suppress(OSError):
        os.replace(path, path.removesuffix(SUFFIX) + UNSETTLED)


def found(roots: list[str]) -> list[str]:
    """The journals, settled or not, in the staging ``roots`` (see :func:`replay`)."""
    return sorted(p for root in roots for suffix in (SUFFIX, UNSETTLED) for p in _glob(root, suffix))


def _glob(root: str, suffix: str) -> list[str]:
    return glob.glob(os.path.join(glob.escape(root), "*", "*" + suffix))
