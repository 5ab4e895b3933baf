"""Packing trials into one job: the launched world split into groups of a trial's ranks, and
a queue on world rank 0 from which each group's leader takes the next trial.

The queue is served by a thread of rank 0 on a communicator of its own (MPI is initialised
with MPI_THREAD_MULTIPLE), so a leader gets its next trial at once even while rank 0 trains
(one-sided MPI would wait for rank 0's next MPI call: up to a whole epoch).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpckit.errors import ConfigError
from hpckit.run.mpi import progress
from hpckit.run.mpi.waiting import receive_from, send_to

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

ASK, ANSWER = 71, 72
POLL_S = 0.01


@dataclass(frozen=True)
class Groups:
    """This rank's group: its communicator, its number, and how many groups take trials."""

    comm: Comm
    number: int
    active: int

    @property
    def leader(self) -> bool:
        return bool(self.comm.rank == 0)

    @property
    def takes_trials(self) -> bool:
        return self.number < self.active


def check(size: int, per_trial: int) -> None:
    """Before anything starts: ``size`` launched ranks split into trials of ``per_trial``."""
    if size % per_trial:
        fits = per_trial * max(1, size // per_trial)
        raise ConfigError(
            f"{size} ranks cannot be split into trials of {per_trial} rank(s): launch a "
            f"multiple of {per_trial} (e.g. mpirun -n {fits}), or give each trial a number of "
            f"ranks that divides {size}.")


def split(world: Comm, per_trial: int, max_concurrent: int | None) -> Groups:
    """Groups of ``per_trial`` consecutive ranks (a node's ranks stay together where the
    launcher placed them so); at most ``max_concurrent`` of them take trials."""
    check(world.size, per_trial)
    number = world.rank // per_trial
    groups = world.size // per_trial
    return Groups(world.Split(number, world.rank), number, min(groups, max_concurrent or groups))


class TrialQueue:
    """Hands out the positions of ``pending`` one at a time, to whichever leader asks first.
    Collective: every rank of ``world`` makes it and closes it."""

    def __init__(self, world: Comm, pending: Sequence[int], leaders: int) -> None:
        self._comm = world.Dup()
        self._pending = list(pending)
        self._lock = threading.Lock()
        self._abandoned = threading.Event()
        self._server: threading.Thread | None = None
        if self._comm.rank == 0:
            self._server = threading.Thread(target=self._serve, args=(leaders,),
                                            name="hpckit-trial-queue", daemon=True)
            self._server.start()

    def take(self) -> int | None:
        """The next trial's index for this rank's group (its leader asks); None when none is
        left."""
        if self._comm.rank == 0:
            return self._next()
        send_to(self._comm, None, 0, ASK)
        answer: int | None = receive_from(self._comm, 0, ANSWER)
        return answer

    def close(self) -> None:
        if self._server is not None:
            self._server.join()
        progress.free(self._comm)

    def abandon(self) -> None:
        """The sweep ends early here (a stop signal, Ctrl-C, an error): the server thread
        stops before the process exits, or it would call MPI while MPI finalizes."""
        self._abandoned.set()
        if self._server is not None:
            self._server.join()

    def _next(self) -> int | None:
        with self._lock:
            return self._pending.pop(0) if self._pending else None

    def _serve(self, leaders: int) -> None:
        """Answer the other leaders until each has been told that nothing is left."""
        from mpi4py import MPI

        remote = leaders - 1  # rank 0 leads a group and takes its trials directly
        status = MPI.Status()
        while remote > 0 and not self._abandoned.is_set():
            if not self._comm.Iprobe(source=MPI.ANY_SOURCE, tag=ASK, status=status):
                time.sleep(POLL_S)
                continue
            asker = status.Get_source()
            receive_from(self._comm, asker, ASK)
            answer = self._next()
            send_to(self._comm, answer, asker, ANSWER)
            remote -= answer is None
