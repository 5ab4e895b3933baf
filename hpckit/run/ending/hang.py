"""The hang watchdog, ``FailureConfig(hang_timeout_s=...)``: a rank on which no ``report()``
completes in time (a peer stuck in a collective, a deadlocked data loader) writes every
thread's Python stack to ``{experiment}/logs/`` and ends with :data:`exits.HUNG`. Its
launcher (``hpckit run``, ``python train.py``) records the attempt as ``hung`` and restarts
it from the newest checkpoint as ``max_failures`` allows; under ``srun``/``mpirun`` every
rank ends, so the job does not sit idle until its time limit.

Each rank watches itself. A rank waiting inside ``report()`` for a stuck peer has not
completed one either, so every rank leaves its stacks, and the stuck rank's show where it
is. The clock starts with the training function (its first report may come after loading
data) and restarts at each completed report; the collective end of the function (which
commits background checkpoints) is watched too. A Python thread does the work;
faulthandler's own C thread is the backstop for a main thread that never lets go of the GIL
(or a storage write that hangs): it dumps the stacks to stderr and ends the rank
:data:`BACKSTOP_S` later, with status 1. faulthandler's timer is one per process: a
program's own ``dump_traceback_later`` is replaced while the watch runs.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import tempfile
import threading
import time
from types import TracebackType
from typing import Any

from hpckit import exits
from hpckit.experiment.artifacts import keep_stacks, stacks_name
from hpckit.logs import log
from hpckit.processes import children
from hpckit.storage.location import Location

BACKSTOP_S = 60.0
LINGER_S = 2.0  # before ending: the other ranks' watchdogs, firing too, write their stacks
WRITE_WAIT_S = 10.0


class HangWatch:
    """Ends this rank when no report completes within ``timeout`` seconds (None: never)."""

    def __init__(self, timeout: float | None, experiment: Location, attempt: int, rank: int):
        self.timeout = timeout
        self.target = experiment.join(stacks_name(attempt, rank))
        self.rank = rank
        self._last = self._armed = time.monotonic()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._stderr: Any = None

    def __enter__(self) -> HangWatch:
        if self.timeout is not None:
            self._stderr = _stderr()
            self._arm()
            self._thread = threading.Thread(target=self._watch, args=(self.timeout,),
                                            name="hpckit-hang-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._thread is not None:
            self._done.set()
            self._thread.join(WRITE_WAIT_S)
            if self._stderr is not None:
                faulthandler.cancel_dump_traceback_later()

    def progressed(self) -> None:
        """A report completed: the clock starts again (the backstop is re-armed now and then,
        not at every report: each arming starts a thread)."""
        if self.timeout is None:
            return
        self._last = time.monotonic()
        if self._last - self._armed > self.timeout / 4:
            self._arm()

    def _arm(self) -> None:
        self._armed = time.monotonic()
        if self._stderr is not None and self.timeout is not None:
            faulthandler.dump_traceback_later(self.timeout + BACKSTOP_S, exit=True,
                                              file=self._stderr)

    def _watch(self, timeout: float) -> None:
        every = min(1.0, timeout / 10)
        while not self._done.wait(every):
            if time.monotonic() - self._last > timeout:
                self._hung()

    def _hung(self) -> None:
        """Keep every thread's stack where the experiment is, say so, and end the rank."""
        with tempfile.TemporaryFile() as dump:
            faulthandler.dump_traceback(dump, all_threads=True)
            dump.seek(0)
            stacks = dump.read()
        kept = _keep(self.target, stacks)
        log.error("rank %d: no report() completed within %.0f s (FailureConfig(hang_timeout_s="
                  "%r)); every thread's stack is in %s. Ending this rank and its child "
                  "processes (exit status %d).", self.rank, self.timeout, self.timeout, kept,
                  exits.HUNG)
        sys.stderr.flush()
        time.sleep(LINGER_S)
        _kill_descendants(os.getpid())
        os._exit(exits.HUNG)


def _stderr() -> Any:
    """A real file for faulthandler's backstop (the program may have replaced sys.stderr),
    or None: then the watch runs without it."""
    stream = sys.__stderr__
    try:
        if stream is None:
            raise ValueError("no stderr")
        stream.fileno()
    except (ValueError, OSError) as exc:
        log.warning("the hang watchdog runs without its backstop: stderr has no file (%s)", exc)
        return None
    return stream


def _keep(target: Location, stacks: bytes) -> str:
    """Write the stacks to ``target`` within WRITE_WAIT_S (the storage may be what hangs),
    else to stderr; where they went."""
    failure: list[BaseException] = []

    def write() -> None:
        try:
            keep_stacks(target, stacks)
        except BaseException as exc:
            failure.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(WRITE_WAIT_S)
    if not writer.is_alive() and not failure:
        return target.display
    sys.stderr.buffer.write(stacks)
    why = failure[0] if failure else f"no answer within {WRITE_WAIT_S:.0f} s"
    return f"stderr (writing {target.display} failed: {why})"


def _kill_descendants(pid: int) -> None:
    """Children of a hung rank (a deadlocked data loader's workers) would outlive it."""
    for child in children(pid):
        _kill_descendants(child.pid)
        with contextlib.suppress(OSError):
            os.kill(child.pid, signal.SIGKILL)
