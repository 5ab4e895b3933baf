"""Reading and writing through pyarrow.fs, with fsync where the filesystem is local.

Every function takes a :class:`Location` and raises :class:`StorageError` naming it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
import posixpath
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow
import pyarrow.fs

from hpckit._uri import Location, redact
from hpckit.errors import StorageError

CHUNK = 8 << 20


@contextlib.contextmanager
def errors_named(location: Location, action: str) -> Iterator[None]:
    """Re-raise storage failures as StorageError naming the location and the likely fix."""
    try:
        yield
    except StorageError:
        raise
    except (OSError, pyarrow.ArrowException) as exc:
        raise StorageError(f"cannot {action} {location.display}: {_explain(exc)}") from exc


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
            return stream.read()


def write_atomic(location: Location, data: bytes) -> None:
    """Replace the object at ``location`` all at once: temp file + fsync + rename, or one PUT."""
    if not location.is_local:
        write_bytes(location, data)  # one PUT: an object is invisible until it is complete
        return
    with errors_named(location, "write"):
        directory = os.path.dirname(location.path)
        tmp = os.path.join(directory, f".{os.path.basename(location.path)}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
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
        return location.filesystem.get_file_info(pyarrow.fs.FileSelector(location.path,
                                                                          allow_not_found=True))


def list_files(location: Location) -> list[tuple[str, int]]:
    """Every file under ``location`` as (relative POSIX path, size)."""
    with errors_named(location, "list"):
        infos = location.filesystem.get_file_info(
            pyarrow.fs.FileSelector(location.path, recursive=True))
    base = location.path.rstrip("/") + "/"
    return sorted((i.path[len(base):], i.size) for i in infos if i.type == pyarrow.fs.FileType.File)


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
        if file_type(location) != pyarrow.fs.FileType.NotFound:
            location.filesystem.delete_dir(location.path)


def delete_file(location: Location, missing_ok: bool = False) -> None:
    with errors_named(location, "delete"):
        try:
            location.filesystem.delete_file(location.path)
        except FileNotFoundError:
            if not missing_ok:
                raise


def persist_file(source: str, target: Location) -> tuple[int, str]:
    """Copy a local file to ``target``, durably, hashing as it goes: (size, sha256 hex)."""
    with errors_named(target, "write"):
        parent = posixpath.dirname(target.path)
        if target.is_local:
            os.makedirs(parent, exist_ok=True)
            return _copy_local(source, target.path)
        if target.filesystem.type_name != "s3":  # S3 has no directories: a marker is a request
            target.filesystem.create_dir(parent, recursive=True)
        return _stream_hashed(source, target)


def _copy_local(source: str, target: str) -> tuple[int, str]:
    """Copy in the kernel while another thread hashes the source through mmap, then fsync.

    The data never passes through Python, so a checkpoint costs little more than writing
    its bytes once; hashlib releases the GIL, so the hash overlaps the copy.
    """
    with open(source, "rb") as src, open(target, "wb") as dst, ThreadPoolExecutor(1) as pool:
        size = os.fstat(src.fileno()).st_size
        hashed = pool.submit(_sha256_mapped, src.fileno(), size)
        _copy_range(src.fileno(), dst.fileno(), size)
        os.fsync(dst.fileno())
        return size, hashed.result()


def _sha256_mapped(fd: int, size: int) -> str:
    if size == 0:
        return hashlib.sha256().hexdigest()
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
        return hashlib.sha256(mapped).hexdigest()


def _copy_range(src: int, dst: int, size: int) -> None:
    copied = 0
    try:
        while copied < size:
            n = os.copy_file_range(src, dst, size - copied, copied, copied)
            if n == 0:
                break
            copied += n
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
    while copied < size:  # the kernel could not copy between these filesystems
        chunk = os.pread(src, min(CHUNK, size - copied), copied)
        if not chunk:
            break
        copied += os.pwrite(dst, chunk, copied)
    if copied != size:
        raise OSError(errno.EIO, f"copied {copied} of {size} bytes: the source changed while copying")


def _stream_hashed(source: str, target: Location) -> tuple[int, str]:
    with open(source, "rb") as src, target.filesystem.open_output_stream(target.path) as dst:
        return pipe_hashed(src, dst, window=UPLOAD_WINDOW)


# pyarrow's S3 stream uploads multipart parts in the background, but queues every part
# written to it: a 1 GiB file would sit in RAM whole. Flushing every window waits for the
# parts in flight, so memory stays near one window per stream while parts still upload
# in parallel within it.
UPLOAD_WINDOW = 32 << 20


def pipe_hashed(src: Any, dst: Any | None, advance: Callable[[int], Any] | None = None,
                window: int | None = None) -> tuple[int, str]:
    """Copy a stream to another (or nowhere), hashing each chunk while it is written:
    hashlib releases the GIL, so the hash overlaps the write. With ``window``, ``dst`` is
    flushed every ``window`` bytes. Returns (size, sha256 hex)."""
    digest = hashlib.sha256()
    size = unflushed = 0
    with ThreadPoolExecutor(1) as hasher:
        while chunk := src.read(CHUNK):
            hashed = hasher.submit(digest.update, chunk)
            if dst is not None:
                dst.write(chunk)
                unflushed += len(chunk)
                if window is not None and unflushed >= window:
                    dst.flush()
                    unflushed = 0
            size += len(chunk)
            hashed.result()
            if advance is not None:
                advance(len(chunk))
    return size, digest.hexdigest()


def sha256_stored(location: Location) -> tuple[int, str]:
    """Size and sha256 of a stored file, read back from storage."""
    with errors_named(location, "read"):
        with location.filesystem.open_input_stream(location.path) as stream:
            return pipe_hashed(stream, None)


def sha256_file(path: str) -> tuple[int, str]:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return size, _sha256_mapped(f.fileno(), size)


def download_file(source: Location, target: str, advance: Callable[[int], Any]) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with errors_named(source, "download"):
        with source.filesystem.open_input_stream(source.path) as stream, open(target, "wb") as out:
            while chunk := stream.read(CHUNK):
                out.write(chunk)
                advance(len(chunk))


def download_dir(source: Location, target: str) -> None:
    """Copy every file under ``source`` into the local directory ``target``."""
    from hpckit._transfer import progress

    files = list_files(source)
    os.makedirs(target, exist_ok=True)
    with progress(sum(size for _, size in files), f"downloading {source.display}") as bar, \
            ThreadPoolExecutor(max(1, min(8, len(files)))) as pool:
        lock = threading.Lock()

        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        for future in [pool.submit(download_file, source.join(rel), os.path.join(target, rel), advance)
                       for rel, _ in files]:
            future.result()
