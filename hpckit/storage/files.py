"""Reading, writing, listing and deleting through pyarrow.fs, with fsync where the filesystem
is local. Every function takes a :class:`Location` and raises :class:`StorageError` naming it.
Copies of whole files are in :mod:`hpckit.storage.copy`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pyarrow
import pyarrow.fs

from hpckit.errors import StorageError
from hpckit.storage.location import Location
from hpckit.storage.uris import redact


@contextlib.contextmanager
def errors_named(location: Location, action: str) -> Iterator[None]:
    """Re-raise storage failures as StorageError naming the location and the likely fix."""
    try:
        yield
    except StorageError:
        raise
    except (OSError, pyarrow.ArrowException) as exc:
        raise StorageError(f"cannot {action} {location.display}: {_explain(exc)}") from exc


PARALLEL_DELETES = 8  # folders deleted at once on object storage (``delete_dir``)
_MISSING_BUCKET = re.compile(r"Bucket '([^']+)' not found|NoSuchBucket")


def _explain(exc: BaseException) -> str:
    text = str(exc)
    if "ACCESS_DENIED" in text or "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text:
        return ("the storage refused the credentials (access denied); check the key and secret in "
                "the URI (s3://KEY:SECRET@bucket/...) or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                "and that they may write this bucket")
    missing = _MISSING_BUCKET.search(text)
    if missing:
        bucket = missing.group(1) if missing.lastindex else "the bucket"
        return (f"bucket {bucket!r} does not exist; create it first (e.g. aws s3 mb s3://{bucket}) "
                "or fix the name in storage_path")
    code = getattr(exc, "errno", None)
    if code == errno.ENOSPC or "No space left" in str(exc):
        return "the disk is full (No space left on device); free space or point storage_path elsewhere"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        reason = getattr(exc, "strerror", None) or exc
        return f"permission denied ({reason}); choose a storage_path you can write"
    return redact(str(exc)) or type(exc).__name__


def file_type(location: Location) -> pyarrow.fs.FileType:
    with errors_named(location, "inspect"):
        return location.filesystem.get_file_info(location.path).type


def make_dir(location: Location) -> None:
    with errors_named(location, "create directory"):
        location.filesystem.create_dir(location.path, recursive=True)


def read_bytes(location: Location) -> bytes:
    with errors_named(location, "read"):
        with location.filesystem.open_input_stream(location.path) as stream:
            data: bytes = stream.read()
            return data


def write_atomic(location: Location, data: bytes, staging: str | None = None,
                 before_rename: Callable[[], None] | None = None) -> None:
    """Replace the object at ``location`` all at once: temp file + fsync + rename, or one PUT.
    The temp file is written beside ``location``, or in the directory ``staging`` (on the same
    filesystem); ``before_rename`` is called between the fsync and the rename."""
    if not location.is_local:
        write_bytes(location, data)  # one PUT: an object is invisible until it is complete
        return
    with errors_named(location, "write"):
        directory = os.path.dirname(location.path)
        name = os.path.basename(location.path)
        tmp = (os.path.join(directory, f".{name}.tmp-{uuid.uuid4().hex[:8]}") if staging is None
               else os.path.join(staging, f"{name}.{uuid.uuid4().hex[:8]}"))
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if before_rename is not None:
                before_rename()
            os.replace(tmp, location.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        fsync_dir(directory)


def write_bytes(location: Location, data: bytes) -> None:
    with errors_named(location, "write"):
        with location.filesystem.open_output_stream(location.path) as stream:
            stream.write(data)


def append_text(location: Location, text: str, whole: Callable[[], str]) -> None:
    """Append ``text``; where the filesystem cannot append (object stores), write ``whole()``."""
    with errors_named(location, "append to"):
        try:
            stream = location.filesystem.open_append_stream(location.path)
        except (pyarrow.ArrowNotImplementedError, NotImplementedError):
            write_bytes(location, whole().encode())
            return
        with stream:
            stream.write(text.encode())


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_dir(location: Location) -> list[pyarrow.fs.FileInfo]:
    with errors_named(location, "list"):
        found: list[pyarrow.fs.FileInfo] = location.filesystem.get_file_info(
            pyarrow.fs.FileSelector(location.path, allow_not_found=True))
        return found


def list_files(location: Location) -> list[tuple[str, int]]:
    """Every file under ``location`` as (relative POSIX path, size)."""
    with errors_named(location, "list"):
        infos = location.filesystem.get_file_info(
            pyarrow.fs.FileSelector(location.path, recursive=True))
    base = location.path.rstrip("/") + "/"
    try:
        return sorted((i.path[len(base):], i.size) for i in infos
                      if i.type == pyarrow.fs.FileType.File)
    except UnicodeDecodeError:
        raise StorageError(f"cannot list {location.display}: {_not_text(location)} is not "
                           "UTF-8 (names are recorded as text, and S3 keys are UTF-8); rename "
                           "it") from None


def _not_text(location: Location) -> str:
    """The first name under a local ``location`` that is not UTF-8, for the error."""
    if location.is_local:
        for parent, dirs, names in os.walk(os.fsencode(location.path)):
            for name in [*dirs, *names]:
                try:
                    name.decode("utf-8")
                except UnicodeDecodeError:
                    return repr(os.fsdecode(os.path.join(parent, name)))
    return "a name"


def escapes(location: Location, root: Location) -> bool:
    """Whether a local path leads out of ``root`` through a symbolic link (object stores have
    no links: never)."""
    if not location.is_local:
        return False
    inside = os.path.realpath(root.path).rstrip("/") + "/"
    return not (os.path.realpath(location.path) + "/").startswith(inside)


def delete_dir(location: Location) -> None:
    """Delete a directory and what is in it; a symbolic link is removed, never followed."""
    with errors_named(location, "delete"):
        if location.is_local and os.path.islink(location.path):
            os.unlink(location.path)
            return
        if file_type(location) == pyarrow.fs.FileType.NotFound:
            return
        if not location.is_local:
            _delete_crowded_folders(location)
        try:
            location.filesystem.delete_dir(location.path)
        except FileNotFoundError:  # on object storage: it held only folders, deleted already
            if location.is_local:
                raise


def _delete_crowded_folders(location: Location) -> None:
    """On object storage, the folders inside a directory that hold two entries or more
    (objects or folders), first, deepest first (those of one depth at once): a server with
    folders of its own (SeaweedFS) that deleted a directory whole kept such a folder as an
    empty one, which no request could remove, and the directory with it."""
    found = location.filesystem.get_file_info(pyarrow.fs.FileSelector(location.path,
                                                                      recursive=True))
    held = Counter(posixpath.dirname(i.path) for i in found)  # objects and folders alike
    top = location.path.rstrip("/")
    crowded = [folder for folder, count in held.items() if count > 1 and folder != top]
    by_depth: dict[int, list[str]] = {}
    for folder in crowded:
        by_depth.setdefault(folder.count("/"), []).append(folder)
    with ThreadPoolExecutor(PARALLEL_DELETES) as pool:
        for depth in sorted(by_depth, reverse=True):
            list(pool.map(partial(_delete_folder, location.filesystem), by_depth[depth]))


def _delete_folder(filesystem: pyarrow.fs.FileSystem, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # gone meanwhile: what was wanted
        filesystem.delete_dir(path)


def delete_file(location: Location, missing_ok: bool = False) -> None:
    with errors_named(location, "delete"):
        try:
            location.filesystem.delete_file(location.path)
        except FileNotFoundError:
            if not missing_ok:
                raise
