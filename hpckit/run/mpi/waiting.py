"""Waiting for other ranks where Ctrl-C reaches the waiting rank.

Inside MPI's blocking collectives a rank busy-polls in C: Python runs no signal handler
there, so Ctrl-C reaches it only when the collective completes, which is never if another
rank was stopped by the same Ctrl-C before it joined. A barrier does not fix that: it can
complete for one rank while another, interrupted in its own wait, has not seen it complete,
and the first then blocks in the collective that follows. So hpckit's steps move their data
with nonblocking point-to-point messages, and every rank waits for them here, in Python,
polling and then sleeping: a rank that waits never blocks on one that gave up, and it leaves
the CPU to the rank it waits for (more ranks than cores, or rank 0 copying a checkpoint).

Rank 0 stopped by Ctrl-C in its part of a step still sends the others :data:`INTERRUPTED`
(:func:`root_work`), so that they stop too even when Ctrl-C reached rank 0 alone.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

T = TypeVar("T")

GATHER_TAG = 0x4850  # distinct from tags that a program's own messages are likely to use
BCAST_TAG = 0x4851
INTERRUPTED = "hpckit: Ctrl-C stopped rank 0 in this step"
_unawaited: list[Any] = []  # sends nobody waits for: their buffers must outlive them


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

    def ready() -> bool:
        if check is not None:
            check()
        return bool(request.Test())

    poll(ready, spin=math.inf if together else SPIN, longest=longest)


def gather_to_root(comm: Comm, value: T) -> list[T] | None:
    """Every rank's ``value`` to rank 0, in rank order (None on the other ranks)."""
    if comm.rank != 0:
        request = comm.isend(value, dest=0, tag=GATHER_TAG)
        poll(lambda: bool(request.test()[0]))
        return None
    values = [value]
    for source in range(1, comm.size):
        poll(partial(comm.iprobe, source=source, tag=GATHER_TAG))
        values.append(comm.recv(source=source, tag=GATHER_TAG))
    return values


def from_root(comm: Comm, value: Any) -> Any:
    """Rank 0's ``value`` on every rank; KeyboardInterrupt where rank 0 sent
    :data:`INTERRUPTED` instead. Rank 0 pickles the value once and sends the same bytes to
    every rank (a run's summary at its end holds the whole metrics history)."""
    from mpi4py import MPI

    if comm.rank == 0:
        data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        requests = [comm.Isend([data, MPI.BYTE], dest=rank, tag=BCAST_TAG)
                    for rank in range(1, comm.size)]
        try:
            poll(lambda: all(r.Test() for r in requests))
        except BaseException:
            _unawaited.append((data, requests))  # MPI may still read the bytes
            raise
        return value
    status = MPI.Status()
    poll(lambda: bool(comm.Iprobe(source=0, tag=BCAST_TAG, status=status)))
    buffer = bytearray(status.Get_count(MPI.BYTE))
    comm.Recv([buffer, MPI.BYTE], source=0, tag=BCAST_TAG)
    received = pickle.loads(buffer)
    if isinstance(received, str) and received == INTERRUPTED:
        raise KeyboardInterrupt
    return received


def root_work(comm: Comm, work: Callable[[], T]) -> T:
    """Rank 0's part of a step whose result the other ranks await in :func:`from_root`: if
    Ctrl-C stops rank 0 here, it still sends them word, and they stop too."""
    try:
        return work()
    except KeyboardInterrupt:
        _unawaited.extend(comm.isend(INTERRUPTED, dest=rank, tag=BCAST_TAG)
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
