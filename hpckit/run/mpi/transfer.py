"""Files from rank to rank over MPI: partner copies of cached checkpoints, and a restart's
files sent to the nodes that lack them.

Every rank knows in advance what it sends and what it receives (both come from one plan), and
the exchange always completes: a sender that cannot read a file sends an error in its place,
a receiver that cannot write keeps receiving and drops the data. Each file's failure comes
back in the result, for the collective step around the exchange to raise on every rank.
Sending and receiving interleave in one loop (at most one chunk in flight per rank), so ranks
that send to each other in a ring never wait on each other, and memory stays at a chunk.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpckit.errors import CheckpointError
from hpckit.run.mpi.waiting import poll
from hpckit.storage.copy import ALGORITHM, Checksum

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

TRANSFER_TAG = 0x4852
CHUNK = 16 << 20
ABSENT = "absent"  # an optional file its sender does not have: no error, nothing written


@dataclass(frozen=True)
class Send:
    dest: int
    path: str  # the local file
    name: str  # its name in the checkpoint
    optional: bool = False  # one its receiver expects either way: absent, it says so


@dataclass(frozen=True)
class Receive:
    source: int
    name: str
    path: str  # where it is written
    algorithm: str = ALGORITHM  # of the checksum it is compared with


@dataclass(frozen=True)
class Received:
    name: str
    size: int
    checksum: str
    error: str | None = None
    absent: bool = False  # an optional file its sender did not have


def exchange(comm: Comm, sends: list[Send], receives: list[Receive],
             arrived: Callable[[], None] = lambda: None,
             abandon: threading.Event | None = None) -> list[Received]:
    """Send ``sends`` and write ``receives`` (synced), in one loop; what arrived, hashed.
    ``arrived`` is called after each file received (a fault point). A background exchange
    ends with an error once ``abandon`` is set (its attempt ended; a peer may be gone)."""
    outgoing = _messages(sends)
    expected: dict[int, deque[Receive]] = {}
    for receive in receives:
        expected.setdefault(receive.source, deque()).append(receive)
    writer = _Writer()
    done: list[Received] = []
    in_flight: Any = None
    pending = next(outgoing, None)

    def progress() -> bool:
        nonlocal in_flight, pending
        if abandon is not None and abandon.is_set():
            raise CheckpointError(f"rank {comm.rank}: the copy of {len(sends)} file(s) to and "
                                  f"{len(receives)} from other ranks was abandoned: its attempt "
                                  "ended (a peer may be gone); the next attempt starts afresh")
        if in_flight is not None and in_flight.test()[0]:
            in_flight = None
        if in_flight is None and pending is not None:
            in_flight = comm.isend(pending[1], dest=pending[0], tag=TRANSFER_TAG)
            pending = next(outgoing, None)
        while any(expected.values()):
            source = _probe(comm, [s for s, waiting in expected.items() if waiting])
            if source is None:
                break
            finished = writer.take(expected[source][0], comm.recv(source=source,
                                                                  tag=TRANSFER_TAG))
            if finished is not None:
                done.append(finished)
                expected[source].popleft()
                if not finished.absent:
                    arrived()
        return in_flight is None and pending is None and not any(expected.values())

    poll(progress)
    return done


def _probe(comm: Comm, sources: list[int]) -> int | None:
    """A source with a message waiting, among those this exchange still expects files from:
    a source that has finished this exchange may already be sending the next one's."""
    return next((s for s in sources if comm.iprobe(source=s, tag=TRANSFER_TAG)), None)


def _messages(sends: list[Send]) -> Iterator[tuple[int, tuple[bytes | None, bool, str | None]]]:
    """(dest, (chunk, last, error)) for every file in order; an unreadable file is one
    message carrying its error."""
    for send in sends:
        try:
            with open(send.path, "rb") as src:
                chunk = src.read(CHUNK)
                while True:
                    following = src.read(CHUNK) if len(chunk) == CHUNK else b""
                    yield send.dest, (chunk, not following, None)
                    if not following:
                        break
                    chunk = following
        except FileNotFoundError as exc:
            yield send.dest, (None, True, ABSENT if send.optional else
                              f"rank could not read {send.path}: {exc}")
        except OSError as exc:
            yield send.dest, (None, True, f"rank could not read {send.path}: {exc}")


class _Writer:
    """The file being received from each source: written, hashed, synced at its last chunk."""

    def __init__(self) -> None:
        self.open: dict[str, tuple[Any, Any, int]] = {}
        self.errors: dict[str, str] = {}

    def take(self, receive: Receive, message: tuple[bytes | None, bool, str | None]
             ) -> Received | None:
        chunk, last, error = message
        if error == ABSENT:
            return Received(receive.name, 0, "", absent=True)
        if error is not None:
            self.errors.setdefault(receive.path, error)
        elif receive.path not in self.errors:
            try:
                self._write(receive, chunk or b"")
            except OSError as exc:
                self.errors[receive.path] = f"could not write {receive.path}: {exc}"
        if not last:
            return None
        return self._close(receive)

    def _write(self, receive: Receive, chunk: bytes) -> None:
        path = receive.path
        if path not in self.open:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.open[path] = (open(path, "wb"), Checksum(receive.algorithm), 0)
        handle, digest, size = self.open[path]
        handle.write(chunk)
        digest.update(chunk)
        self.open[path] = (handle, digest, size + len(chunk))

    def _close(self, receive: Receive) -> Received:
        handle, digest, size = self.open.pop(receive.path, (None, Checksum(receive.algorithm), 0))
        if handle is not None:
            try:
                handle.flush()
                os.fsync(handle.fileno())
            except OSError as exc:
                self.errors.setdefault(receive.path, f"could not sync {receive.path}: {exc}")
            finally:
                handle.close()
        return Received(receive.name, size, digest.value, self.errors.pop(receive.path, None))
