"""Waiting for other ranks where Ctrl-C reaches the waiting rank.

Inside MPI's blocking collectives a rank busy-polls in C: Python runs no signal handler
there, so Ctrl-C reaches it only when the collective completes, which is never if another
rank was stopped by the same Ctrl-C before it joined. So hpckit's steps start MPI's own
nonblocking collectives (Igather and Igatherv to rank 0, Ibcast from it: the library's tree
and shared-memory algorithms, so rank 0 handles a few messages per step whatever the number
of ranks), and every rank waits for them here, in Python, polling and then sleeping: Ctrl-C
reaches a waiting rank, and it leaves the CPU to the rank it waits for (more ranks than
cores, or rank 0 copying a checkpoint). Values cross as pickles: their sizes first, then
their bytes.

Every step ends with :func:`~hpckit.run.mpi.progress.left`: a rank that leaves it keeps MPI
progressing until every rank has left it, since a peer may still need this rank's MPI calls
to receive its bytes (a gather is part of a step: the step ends in :func:`from_root`).

A nonblocking collective cannot be cancelled, so a step that Ctrl-C interrupted leaves its
communicator unusable: what follows (the meeting before the ranks exit, ``run.ending.exit``)
runs on a communicator of its own. Rank 0 stopped by Ctrl-C in its part of a step still
sends the others word (:data:`INTERRUPTED`, point to point, outside the collectives: the
one loop over the ranks, on that path only), so that they stop too even when Ctrl-C reached
rank 0 alone.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import os
import pickle
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from hpckit.run.mpi import progress

if TYPE_CHECKING:
    from mpi4py.MPI import Comm, Request

T = TypeVar("T")

INTERRUPT_TAG = 0x4851  # distinct from tags that a program's own messages are likely to use
INTERRUPTED = "hpckit: Ctrl-C stopped rank 0 in this step"
_unawaited: list[Any] = []  # requests nobody waits for, with their buffers: MPI may use them
_alarmed: set[int] = set()  # communicators on which rank 0 sent word of Ctrl-C (by handle)


@dataclass(frozen=True)
class Traffic:
    """The collectives this process started in hpckit's steps (:func:`gather_to_root`,
    :func:`from_root`, :func:`wait_for_all`, the barrier that ends each step: :func:`left`;
    polls such as Test or Iprobe are not calls), and the bytes it passed to them: what
    ``benchmarks/scale.py`` counts on rank 0. A collective counts once, with the bytes this
    rank passed to it."""

    calls: int = 0
    sent: int = 0

    def __sub__(self, earlier: Traffic) -> Traffic:
        return Traffic(self.calls - earlier.calls, self.sent - earlier.sent)


_traffic = Traffic()
_counting = threading.Lock()  # background threads start collectives too (wait_for_all)


def traffic() -> Traffic:
    """Everything counted since this process started."""
    return _traffic


def _count(calls: int, sent: int) -> None:
    global _traffic
    with _counting:
        _traffic = Traffic(_traffic.calls + calls, _traffic.sent + sent)


# A waiting rank yields the CPU for SPIN seconds, then sleeps in steps of at most LONGEST.
# Two ranks that take turns waiting for each other (every metrics-only report: a gather to
# rank 0, then its reply) must not both be asleep when the other arrives: with sleeps that
# backed off to 5 ms, each wait overslept, the other rank then waited longer in turn, and
# the ranks fell into step with the sleeps (16 ms per report, 80 % of a 20 ms step). Ranks
# arriving within SPIN of each other now meet within microseconds, and a longer wait
# oversleeps by at most LONGEST.
SPIN = 0.02
LONGEST = 0.001


def poll(ready: Callable[[], bool], spin: float = SPIN, first: float = 0.0001,
         longest: float = LONGEST) -> None:
    """Until ``ready()``: spin for ``spin`` seconds, yielding the CPU between tries (more
    ranks than cores: the one we wait for runs), then sleep between tries, a little longer
    each time up to ``longest``. Python runs signal handlers between tries, so Ctrl-C
    reaches a waiting rank."""
    until = time.perf_counter() + spin
    while time.perf_counter() < until:
        if ready():
            return
        os.sched_yield()
    delay = first
    while not ready():
        time.sleep(delay)
        delay = min(delay * 2, longest)


def wait_for_all(comm: Comm, together: bool = False,
                 check: Callable[[], None] | None = None, longest: float = LONGEST) -> None:
    """A barrier that sleeps while it waits, and that Ctrl-C interrupts. ``together``: every
    rank leaves it within microseconds, as from MPI's own barrier, by yielding the CPU instead
    of sleeping; for ranks that exit right after it without MPI_Finalize (status 75), since
    mpiexec kills the ranks still running when one exits so (they would end with status 9).
    ``check`` is called between tries, and gives the wait up by raising (a background thread
    whose attempt ended); a wait that may be long sleeps up to ``longest`` between them."""
    request = comm.Ibarrier()
    _count(1, 0)

    def ready() -> bool:
        if check is not None:
            check()
        return bool(request.Test())

    poll(ready, spin=math.inf if together else SPIN, longest=longest)
    left(comm)


def left(comm: Comm) -> None:
    """The end of a step on ``comm`` (collective): this rank's MPI goes on progressing, in
    the background, until every rank has left the step (:mod:`~hpckit.run.mpi.progress`)."""
    _count(1, 0)
    progress.left(comm)


def gather_to_root(comm: Comm, value: T) -> list[T] | None:
    """Every rank's ``value`` to rank 0, in rank order (None on the other ranks): a part of a
    step, which ends in :func:`from_root` (or :func:`left`)."""
    data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    if comm.rank != 0:
        gather_bytes(comm, data)
        return None
    with _alarming(comm):
        gathered = gather_bytes(comm, data)
    with collection_paused():
        return [pickle.loads(item) for item in gathered or []]


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Rank 0 reads a value from every rank at once: tens of thousands of new objects, all
    kept to the end of the step, which the cyclic garbage collector would otherwise scan
    again and again as they arrive (up to half of the time at 100,000 ranks,
    ``benchmarks/scale_model.py``). It runs as usual once they are read."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def gather_bytes(comm: Comm, data: bytes, alarms: Comm | None = None) -> list[memoryview] | None:
    """Every rank's ``data`` to ``comm``'s rank 0, in rank order (None on the other ranks): an
    Igather of the sizes, then an Igatherv of the bytes. ``alarms``: the communicator on which
    word of Ctrl-C comes from its rank 0 (``comm`` itself where not given)."""
    from mpi4py import MPI

    size = array("q", [len(data)])
    _count(2, 8 + len(data))
    if comm.rank != 0:
        _await(comm, [comm.Igather([size, MPI.INT64_T], None, root=0),
                      comm.Igatherv([data, MPI.BYTE], None, root=0)], (size, data), alarms)
        return None
    sizes = array("q", bytes(8 * comm.size))
    _await(comm, [comm.Igather([size, MPI.INT64_T], [sizes, MPI.INT64_T], root=0)], sizes, alarms)
    offsets = list(itertools.accumulate(sizes, initial=0))
    gathered = bytearray(offsets.pop())
    _await(comm, [comm.Igatherv([data, MPI.BYTE], [gathered, (sizes, offsets), MPI.BYTE],
                                root=0)], (data, gathered), alarms)
    view = memoryview(gathered)
    return [view[at:at + length] for at, length in zip(offsets, sizes, strict=True)]


def to_root(comm: Comm, value: T) -> list[T] | None:
    """Every rank's ``value`` to rank 0, in rank order (None on the other ranks), as a step of
    its own: it ends with :func:`left`."""
    gathered = (root_work(comm, lambda: gather_to_root(comm, value)) if comm.rank == 0
                else gather_to_root(comm, value))
    left(comm)
    return gathered


def from_root(comm: Comm, value: Any) -> Any:
    """Rank 0's ``value`` on every rank (``value`` is ignored elsewhere); KeyboardInterrupt
    where Ctrl-C stopped rank 0 in the step instead."""
    from mpi4py import MPI

    if comm.rank == 0:
        with _alarming(comm):
            data = bytearray(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
            size = array("q", [len(data)])
            _count(2, 8 + len(data))
            _await(comm, [comm.Ibcast([size, MPI.INT64_T], root=0),
                          comm.Ibcast([data, MPI.BYTE], root=0)], (size, data))
        left(comm)
        return value
    size = array("q", [0])
    _count(2, 0)
    _await(comm, [comm.Ibcast([size, MPI.INT64_T], root=0)], size)
    data = bytearray(size[0])
    _await(comm, [comm.Ibcast([data, MPI.BYTE], root=0)], data)
    left(comm)
    return pickle.loads(data)


def quiet_everywhere(comm: Comm, count: int, quiet: bool) -> bool:
    """Whether every rank is ``quiet`` at the same ``count``: one Iallreduce of three
    integers (the highest count, minus the lowest, and whether any rank has more to say), so
    that a step with nothing to tell costs a tree's depth and no pickles. Every step that may
    take its place starts with it, so that ranks making different calls still meet in the
    gathers that follow, where the mismatch is told."""
    from mpi4py import MPI

    mine, agreed = array("q", [count, -count, 0 if quiet else 1]), array("q", bytes(24))
    _count(1, 24)
    with _alarming(comm) if comm.rank == 0 else contextlib.nullcontext():
        _await(comm, [comm.Iallreduce([mine, MPI.INT64_T], [agreed, MPI.INT64_T], op=MPI.MAX)],
               (mine, agreed))
    quiet = agreed[2] == 0 and agreed[0] == -agreed[1]
    if quiet:  # the step ends here; otherwise every rank goes on into its gathers
        left(comm)
    return quiet


def root_work(comm: Comm, work: Callable[[], T]) -> T:
    """Rank 0's part of a step whose result the other ranks await in :func:`from_root`: if
    Ctrl-C stops rank 0 here, it still sends them word, and they stop too."""
    with _alarming(comm):
        return work()


def _await(comm: Comm, requests: list[Request], buffers: Any, alarms: Comm | None = None
           ) -> None:
    """Until every request completes. On a rank other than 0 of ``alarms`` (``comm`` where
    not given), KeyboardInterrupt where its rank 0 sent word of Ctrl-C instead. A wait given
    up leaves the requests and their ``buffers`` to MPI, which may still use them."""
    from mpi4py import MPI

    watched = comm if alarms is None else alarms

    def ready() -> bool:
        if watched.rank != 0 and watched.Iprobe(source=0, tag=INTERRUPT_TAG):
            watched.recv(source=0, tag=INTERRUPT_TAG)
            raise KeyboardInterrupt
        return bool(MPI.Request.Testall(requests))

    try:
        poll(ready)
    except BaseException:
        _unawaited.append((requests, buffers))
        raise


@contextlib.contextmanager
def _alarming(comm: Comm) -> Iterator[None]:
    """Rank 0: if Ctrl-C stops it inside, every other rank is sent word, once a communicator."""
    try:
        yield
    except KeyboardInterrupt:
        if comm.py2f() not in _alarmed:
            _alarmed.add(comm.py2f())
            _unawaited.extend(comm.isend(INTERRUPTED, dest=rank, tag=INTERRUPT_TAG)
                              for rank in range(1, comm.size))
        raise


def share(comm: Comm, value: T) -> list[T]:
    """Every rank's ``value`` on every rank, in rank order: an allgather that Ctrl-C reaches."""
    gathered = (root_work(comm, lambda: gather_to_root(comm, value)) if comm.rank == 0
                else gather_to_root(comm, value))
    return list(from_root(comm, gathered))


def send_to(comm: Comm, value: Any, dest: int, tag: int) -> None:
    """A point-to-point send, waited for where Ctrl-C reaches the rank."""
    request = comm.isend(value, dest=dest, tag=tag)
    poll(lambda: bool(request.test()[0]))


def receive_from(comm: Comm, source: int, tag: int, longest: float = LONGEST) -> Any:
    """The next message from ``source`` (``MPI.ANY_SOURCE`` for any) with ``tag``, waited
    for where Ctrl-C reaches the rank; a wait that may be long sleeps up to ``longest``
    seconds between looks."""
    poll(lambda: bool(comm.iprobe(source=source, tag=tag)), longest=longest)
    return comm.recv(source=source, tag=tag)


def next_from(comm: Comm, source: int, longest: float = LONGEST) -> tuple[int, Any]:
    """The next message from ``source`` whatever its tag, and its tag; waited for as
    :func:`receive_from` waits."""
    from mpi4py import MPI

    status = MPI.Status()
    poll(lambda: bool(comm.iprobe(source=source, tag=MPI.ANY_TAG, status=status)),
         longest=longest)
    tag = status.Get_tag()
    return tag, comm.recv(source=source, tag=tag)


def meet_within(comm: Comm, seconds: float) -> bool:
    """Wait at most ``seconds`` for every rank to come here; whether all came."""
    request = comm.Ibarrier()
    deadline = time.monotonic() + seconds
    while not request.Test() and time.monotonic() < deadline:
        time.sleep(0.005)
    return bool(request.Test())
