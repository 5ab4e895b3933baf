"""One download per node: concurrent users of a remote checkpoint share one local copy.

Ranks of a node, and their DataLoader worker processes, may all open the same remote
checkpoint at once. The first downloads it into ``$HPCKIT_LOCAL_DIR/hpckit-downloads/KEY``
while the others wait on a file lock; each user leaves a marker named after its pid, and the
last one to leave removes the copy. Markers of processes that died are ignored, so a killed
rank does not keep a copy alive forever.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

from hpckit.logs import log
from hpckit.processes import alive
from hpckit.storage.copy import download_dir
from hpckit.storage.location import Location


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
