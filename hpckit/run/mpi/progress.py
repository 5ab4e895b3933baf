"""MPI's progress for the peers of a rank that has left an exchange.

MPI promises progress only to a rank inside an MPI call, and libfabric's tcp and shm
providers (MPICH's OFI network module, Open MPI and Intel MPI over OFI) move a message only
while both ends call MPI. So an exchange can be complete on one rank (its requests done,
its bytes still queued, or the connection they need still being made) while a peer still
waits for those bytes. If the rank that left then blocks outside MPI on that peer (torch's
TCP store and its first all-reduce, a file the peer writes, a subprocess), neither moves:
the peer waits for this rank's MPI, this rank for the peer's torch.

So every step of hpckit's ends with :func:`left`: each rank, as it leaves the step, starts a
nonblocking barrier on the step's communicator and hands it to this module's thread, which
tests it (each test drives the library's progress engine) until it completes. It completes
only once every rank has left the step, and by then no rank needs anything more of this
one for it. The barrier's own messages need progress too, but no rank blocks on them: one
still pending is driven by this thread, and by any MPI call of the rank's.

The cost: one barrier, without bytes, per step, and a thread that runs only while one is
pending, testing it with sleeps of at most :data:`LONGEST` seconds. Point-to-point messages
(a sweep's trial queue, the validation ranks' tasks) need none: in each, the rank that waits
for a send to complete tests it in MPI, and the rank that received goes on inside MPI or
waits on nobody.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import TYPE_CHECKING

from hpckit.logs import log

if TYPE_CHECKING:
    from mpi4py.MPI import Comm, Request

FIRST = 0.00005
LONGEST = 0.002  # the longest a peer's bytes wait for this rank's next test
STALE = 10.0  # a barrier pending this long waits on a rank that will not come soon (or
STALE_LONGEST = 0.1  # ever: it died, or Ctrl-C cut the step): it is tested less often
AT_EXIT = 5.0  # seconds a rank that exits waits for its peers to leave their last step
BEFORE_FREE = 30.0  # seconds a communicator's last barrier may take before it is freed

_pending: list[tuple[Request, float, int]] = []  # when each started, and its communicator
_changed = threading.Condition()
_driver: threading.Thread | None = None
_alone = False  # MPI cannot serve a second thread: the barrier is waited for in the step


def left(comm: Comm) -> None:
    """This rank has left a step on ``comm`` (collective: every rank of ``comm`` calls it at
    the same point, after the same steps); its MPI goes on progressing until every rank
    has left the step too."""
    request = comm.Ibarrier()
    if _alone or not _driving():
        _wait(request)
        return
    with _changed:
        _pending.append((request, time.monotonic(), comm.py2f()))
        _changed.notify_all()


def pending() -> int:
    """Barriers started and not yet complete."""
    with _changed:
        return len(_pending)


def settled(timeout: float, comm: Comm | None = None) -> bool:
    """Wait, at most ``timeout`` seconds, until every step this rank left (on ``comm``, or
    on any communicator) has been left by every rank; whether it has."""
    handle = None if comm is None else comm.py2f()
    deadline = time.monotonic() + timeout
    with _changed:
        while any(handle in (None, h) for _, _, h in _pending):
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return False
            _changed.wait(left_s)
    return True


def free(comm: Comm, timeout: float = BEFORE_FREE) -> None:
    """Free ``comm`` (collective) once its barriers are complete, waiting at most
    ``timeout`` seconds: a nonblocking collective that MPI still progresses on a freed
    communicator crashes Open MPI. One whose barrier does not complete (a rank died, Ctrl-C
    cut a step) is left to MPI, unfreed."""
    if settled(timeout, comm):
        comm.Free()
    else:
        log.debug("a communicator's last step was not left by every rank in %.0f s: it is "
                  "not freed", timeout)


def _driving() -> bool:
    """Whether the thread runs (started at the first barrier, where MPI serves threads)."""
    global _driver, _alone
    if _driver is not None:
        return True
    from mpi4py import MPI

    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        _alone = True
        log.warning("MPI runs without MPI_THREAD_MULTIPLE (mpi4py.rc.thread_level or the "
                    "library's build), so hpckit cannot keep MPI progressing while training "
                    "runs: each step waits until every rank has left it. Over a network "
                    "that needs both ends' MPI calls (OFI's tcp provider) a start or a report "
                    "may then hang; use an MPI built with thread support.")
        return False
    _driver = threading.Thread(target=_drive, name="hpckit-mpi-progress", daemon=True)
    _driver.start()
    atexit.register(settled, AT_EXIT)  # after mpi4py's own hook, so before MPI_Finalize
    return True


def _drive() -> None:
    """Test the pending barriers until each completes; sleep while none is pending. The only
    thread that tests them (MPI forbids two threads to test one request)."""
    delay = FIRST
    while True:
        with _changed:
            while not _pending:
                _changed.wait()
                delay = FIRST
            requests = list(_pending)
        done = {id(request) for request, _, _ in requests if request.Test()}
        if done:
            with _changed:
                _pending[:] = [p for p in _pending if id(p[0]) not in done]
                _changed.notify_all()
            delay = FIRST
            continue
        oldest = time.monotonic() - requests[0][1]
        time.sleep(delay)
        delay = min(delay * 2, LONGEST if oldest < STALE else STALE_LONGEST)


def _wait(request: Request) -> None:
    while not request.Test():
        time.sleep(FIRST)
