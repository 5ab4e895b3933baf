"""The experiment's one writer: the thread of rank 0 that makes every change to it.

Rank 0 changes the experiment from several threads: the training thread commits a
synchronous checkpoint and records the end of the attempt, the commit thread of the
background checkpoints, the validation threads a validation's outcome. Every such change is
handed to this one thread, which makes them one at a time in the order they were handed over:
no two writes of the manifest or the metrics log ever overlap, and no lock is held across
them. A thread that hands a change over waits for it (the training thread waits only where
the collective step needs the outcome); a change that fails raises in the thread that handed
it over.

The writer is a :class:`~hpckit.background.Worker` at normal priority, not at the idle
priority of the copy and hash threads: every rank waits for it at a synchronous commit, and at
idle priority on a busy node a commit took over a second instead of 12 ms
(``benchmarks/writer_priority.py``).

When the attempt ends the writer is closed: it refuses new changes (a validation that outlived
its attempt writes nothing), makes those already handed over, and stops, before the lock is
released. A Ctrl-C while the training thread waits for a change is held until the change is
made (a manifest replaced and remembered is one step); a second one ends the process at once,
leaving the lock to go stale (see :mod:`hpckit.background`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from hpckit.background import NORMAL, Worker, deferred, waited
from hpckit.errors import ExperimentClosedError

T = TypeVar("T")


class Writer:
    """One thread that makes the experiment's changes in order; ``inline`` for a maintenance
    command, which has no other thread to share the experiment with."""

    def __init__(self, display: str, inline: bool = False) -> None:
        self.display = display
        self._worker = None if inline else Worker("hpckit-writer", NORMAL)
        self._closed = False
        self._closing = threading.Lock()

    @property
    def on_its_thread(self) -> bool:
        return self._worker is None or self._worker.on_its_thread

    def submit(self, change: Callable[[], T]) -> Future[T]:
        """Hand ``change`` over; it is made after every change handed over before it."""
        with self._closing:
            self._refuse_if_closed()
            if self._worker is not None:
                return self._worker.submit(change)
        return _done(change)

    def run(self, change: Callable[[], T]) -> T:
        """Make ``change`` and return its outcome; from the writer's own thread, at once."""
        if self.on_its_thread and self._worker is not None:
            return change()
        if self._worker is None:
            with self._closing:
                self._refuse_if_closed()
            with deferred():
                return change()
        return waited(self.submit(change))

    def close(self) -> None:
        """Refuse every later change, make those handed over, stop the thread."""
        with self._closing:
            self._closed = True
        if self._worker is not None:
            self._worker.stop()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise ExperimentClosedError(
                f"experiment {self.display} was closed at the end of its attempt; nothing "
                "more is written to it by this attempt")


def _done(change: Callable[[], T]) -> Future[T]:
    future: Future[T] = Future()
    try:
        future.set_result(change())
    except BaseException as exc:  # noqa: BLE001  (the caller's, through the future)
        future.set_exception(exc)
    return future


def written(method: Callable[..., T]) -> Callable[..., T]:
    """A method that changes the experiment: made on its ``writer``'s thread."""
    @functools.wraps(method)
    def on_the_writer(owner: Any, *args: Any, **kwargs: Any) -> T:
        return owner.writer.run(lambda: method(owner, *args, **kwargs))  # type: ignore[no-any-return]
    return on_the_writer
