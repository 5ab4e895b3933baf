"""One checksummed copy of a file between any two locations: persist, upload, download,
export, mirror and artifacts all go through :func:`copy_file` (checksums: ``checksum.py``).

Local to local, the kernel copies (``copy_file_range``) while another thread hashes the
source through mmap: the bytes never pass through Python. Any other pair streams in chunks,
hashing each chunk while it is written, and flushes every :data:`UPLOAD_WINDOW` bytes so
that memory stays bounded (pyarrow's S3 stream otherwise queues every part of a file).

One download per node: concurrent users of a remote checkpoint share one local copy.

Ranks of a node, and their DataLoader worker processes, may all open the same remote
checkpoint at once. The first downloads it into ``$HPCKIT_LOCAL_DIR/hpckit-downloads/KEY``
while the others wait on a file lock; each user leaves a marker named after its pid, and the
last one to leave removes the copy. Markers of processes that died are ignored, so a killed
rank does not keep a copy alive forever.

Per-file checksums, named by their algorithm.

A checksum is one string, ``"<algorithm>:<hex>"``, so that a manifest, a comparison or an
error message never separates the value from how it was computed. New files get XXH3-128
(about 10 GB/s on one core, against SHA-256's 1.2 GB/s: the hash no longer competes with
training for the CPU; both release the GIL). The checksum guards against damage (a torn
write, a flipped byte, a truncated upload), not against someone forging a file, which a
checkpoint directory's permissions do. Manifests written before it recorded a bare SHA-256
in a ``sha256`` field; they are read as ``"sha256:<hex>"`` and verify as before.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
import posixpath
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import click
import xxhash

from hpckit.logs import log
from hpckit.processes import alive
from hpckit.storage.files import errors_named, fsync_dir, list_files
from hpckit.storage.location import Location, local

ALGORITHM = "xxh3-128"
SHA256 = "sha256"
_NEW: dict[str, Callable[[], Any]] = {ALGORITHM: xxhash.xxh3_128, SHA256: hashlib.sha256}
ALGORITHMS = tuple(_NEW)


class Checksum:
    """A checksum being computed: feed it bytes with :meth:`update`, read :attr:`value`."""

    def __init__(self, algorithm: str = ALGORITHM) -> None:
        if algorithm not in _NEW:
            raise ValueError(f"unknown checksum algorithm {algorithm!r}; hpckit knows "
                             f"{', '.join(ALGORITHMS)}")
        self.algorithm = algorithm
        self._hash = _NEW[algorithm]()

    def update(self, data: Any) -> None:
        self._hash.update(data)

    @property
    def value(self) -> str:
        return f"{self.algorithm}:{self._hash.hexdigest()}"


def checksum_of(data: Any, algorithm: str = ALGORITHM) -> str:
    """The checksum of bytes (or any buffer) already in memory."""
    running = Checksum(algorithm)
    running.update(data)
    return running.value


def algorithm_of(checksum: str) -> str:
    """The algorithm a checksum was computed with ("xxh3-128", "sha256")."""
    return checksum.partition(":")[0]


def problem(checksum: str) -> str | None:
    """Why ``checksum`` is not one hpckit can verify, or None when it is."""
    algorithm, colon, digest = checksum.partition(":")
    if not colon or algorithm not in _NEW:
        return (f"{checksum[:40]!r} is not '<algorithm>:<hex>' with an algorithm this hpckit "
                f"knows ({', '.join(ALGORITHMS)}); a newer hpckit may have written it")
    if len(digest) != _NEW[algorithm]().digest_size * 2 or not _is_hex(digest):
        return f"{checksum[:40]!r} is not a {algorithm} digest in hex"
    return None


def short(checksum: str) -> str:
    """A checksum for a message: its algorithm and the first 12 hex digits."""
    algorithm, _, digest = checksum.partition(":")
    return f"{algorithm} {digest[:12]}..."


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


CHUNK = 8 << 20
# Flushing every window waits for the parts in flight, so memory stays near one window per
# stream while parts still upload in parallel within it.
UPLOAD_WINDOW = 32 << 20
PROGRESS_FROM = 64 << 20  # a bar only for transfers that take a while, and only on a terminal
PARALLEL = 8

Advance = Callable[[int], Any]


def progress(total: int, label: str) -> Any:
    """A progress bar for transfers of at least PROGRESS_FROM bytes, drawn on a terminal only
    (batch logs stay quiet)."""
    show = total >= PROGRESS_FROM and sys.stderr.isatty()
    return click.progressbar(length=total, label=label, file=sys.stderr, hidden=not show)


def copy_file(source: Location, target: Location, advance: Advance | None = None,
              algorithm: str = ALGORITHM) -> tuple[int, str]:
    """Copy one file, creating the target's directory, durably where the target is local.
    Returns (size, checksum) of what was copied. Errors name the source when it cannot be
    opened, and the target for everything after (a full disk, a refused upload)."""
    with errors_named(source, "read"):
        src = (open(source.path, "rb") if source.is_local
               else source.filesystem.open_input_stream(source.path))
    with src, errors_named(target, "write"):
        parent = posixpath.dirname(target.path)
        if target.is_local:
            os.makedirs(parent, exist_ok=True)
        elif target.filesystem.type_name != "s3":  # S3 has no directories: a marker is a request
            target.filesystem.create_dir(parent, recursive=True)
        if source.is_local and target.is_local:
            size, digest = _copy_local(src, target.path, algorithm)
            if advance is not None:
                advance(size)
            return size, digest
        return _copy_streams(src, target, advance, algorithm)


def persist_file(source: str, target: Location, algorithm: str = ALGORITHM) -> tuple[int, str]:
    """Copy the local file ``source`` to ``target`` durably: (size, checksum)."""
    return copy_file(local(source), target, algorithm=algorithm)


def _copy_local(src: Any, target: str, algorithm: str) -> tuple[int, str]:
    with open(target, "wb") as dst, ThreadPoolExecutor(1) as pool:
        size = os.fstat(src.fileno()).st_size
        hashed = pool.submit(_checksum_mapped, src.fileno(), size, algorithm)
        _copy_range(src.fileno(), dst.fileno(), size)
        os.fsync(dst.fileno())
        return size, hashed.result()


def _copy_streams(src: Any, target: Location, advance: Advance | None,
                  algorithm: str) -> tuple[int, str]:
    if target.is_local:
        with open(target.path, "wb") as dst:
            result = _pipe_hashed(src, dst, algorithm, advance)
            dst.flush()
            os.fsync(dst.fileno())
            return result
    with target.filesystem.open_output_stream(target.path) as out:
        return _pipe_hashed(src, out, algorithm, advance, window=UPLOAD_WINDOW)


def _checksum_mapped(fd: int, size: int, algorithm: str) -> str:
    running = Checksum(algorithm)
    if size:
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
            running.update(mapped)
    return running.value


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


def _pipe_hashed(src: Any, dst: Any | None, algorithm: str, advance: Advance | None = None,
                 window: int | None = None) -> tuple[int, str]:
    """Copy a stream to another (or nowhere), hashing each chunk while it is written:
    the hash releases the GIL, so it overlaps the write."""
    digest = Checksum(algorithm)
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
    return size, digest.value


def checksum_stored(location: Location, algorithm: str = ALGORITHM) -> tuple[int, str]:
    """Size and checksum of a stored file, read back from storage."""
    with errors_named(location, "read"):
        if location.is_local:
            return checksum_file(location.path, algorithm=algorithm)
        with location.filesystem.open_input_stream(location.path) as stream:
            return _pipe_hashed(stream, None, algorithm)


def checksum_file(path: str, sync: bool = False, algorithm: str = ALGORITHM) -> tuple[int, str]:
    """Size and checksum of a local file; with ``sync`` its data is made durable too (for a
    file that is already where it is committed: written in place, or moved there)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not sync:
            return size, _checksum_mapped(f.fileno(), size, algorithm)
        with ThreadPoolExecutor(1) as pool:  # the disk writes while the CPU hashes
            synced = pool.submit(os.fsync, f.fileno())
            digest = _checksum_mapped(f.fileno(), size, algorithm)
            synced.result()
        return size, digest


def download_dir(source: Location, target: str) -> None:
    """Copy every file under ``source`` into the local directory ``target``, in parallel."""
    files = list_files(source)
    os.makedirs(target, exist_ok=True)
    destination = local(target)
    with progress(sum(size for _, size in files), f"downloading {source.display}") as bar, \
            ThreadPoolExecutor(max(1, min(PARALLEL, len(files)))) as pool:
        lock = threading.Lock()

        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        for future in [pool.submit(copy_file, source.join(rel), destination.join(rel), advance)
                       for rel, _ in files]:
            future.result()


def fsync_tree(root: str, files: list[str]) -> None:
    """fsync the directories that hold ``files`` (relative to ``root``), and root's parent,
    so that the new names are durable too."""
    dirs = {root, os.path.dirname(root)}
    for rel in files:
        parts = rel.split("/")[:-1]
        dirs.update(os.path.join(root, *parts[:i]) for i in range(1, len(parts) + 1))
    for directory in dirs:
        fsync_dir(directory)


@contextlib.contextmanager
def shared_copy(location: Location, local_dir: str | None) -> Iterator[str]:
    base = os.path.join(local_dir or tempfile.gettempdir(), "hpckit-downloads")
    os.makedirs(base, exist_ok=True)
    key = hashlib.sha256(f"{location.filesystem.type_name}\0{location.display}".encode()).hexdigest()
    root = os.path.join(base, key[:24])
    data, users = os.path.join(root, "data"), os.path.join(root, "users")
    me = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with _locked(root):
        os.makedirs(users, exist_ok=True)
        if not _live_users(users):
            _remove_partial(root)
        if not os.path.isdir(data):
            partial = os.path.join(root, f"partial-{me}")
            log.info("downloading %s to %s (once for this node)", location.display, data)
            download_dir(location, partial)
            os.rename(partial, data)
        open(os.path.join(users, me), "w").close()
    try:
        yield data
    finally:
        with _locked(root):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(users, me))
            if not _live_users(users):
                shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _locked(root: str) -> Iterator[None]:
    with open(f"{root}.lock", "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _live_users(users: str) -> list[str]:
    """Markers of processes still alive; those of dead ones are removed."""
    live = []
    for name in os.listdir(users):
        pid = name.split("-", 1)[0]
        if pid.isdigit() and alive(int(pid)):
            live.append(name)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(users, name))
    return live


def _remove_partial(root: str) -> None:
    for name in os.listdir(root):
        if name.startswith("partial-"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
