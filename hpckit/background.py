"""The one pattern for a run's background work (ground layer): a :class:`Worker` is a
thread, or a few, that does what it is handed in the order handed over, started at the first
piece of work. Each piece comes back as a ``Future``: its owner collects the outcome and
raises a failure where the run hears of it (at the next collective step, the next report or
save), never in the worker. ``stop`` makes what was handed over (or cancels what has not
started) and ends the threads.

One priority rule, measured (``benchmarks/writer_priority.py``): work that the ranks wait for,
or that must keep pace with the commits, runs at ``NORMAL`` priority (the experiment's writer,
the purge a new checkpoint waits for, the mirror, which copies checkpoints the purge deletes
once newer ones come); the rest runs at ``IDLE`` (Linux's ``SCHED_IDLE``: copies, hashes,
serialisation, validations), on a core only when training leaves one idle. At
idle priority, a write every rank waited for took over a second instead of 12 ms on a busy node.

Ctrl-C held back while a step that must not be cut in two completes (ground layer).

Replacing the manifest and remembering the replacement is one such step: an interrupt that
landed between the two would make the owner later write back the manifest it had replaced,
forgetting a checkpoint already committed. A second Ctrl-C during the step is a person who
will not wait (an S3 PUT that hangs for its whole timeout): the process ends at once, leaving
its lock to go stale as a killed run's does, since releasing it could let another run in
while the write may still land.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

from hpckit.processes import background_thread

T = TypeVar("T")
Priority = Literal["normal", "idle"]
NORMAL: Priority = "normal"
IDLE: Priority = "idle"


class Worker:
    """Background threads named ``name`` that do the work handed to them, in order."""

    def __init__(self, name: str, priority: Priority, threads: int = 1) -> None:
        self.name = name
        self.priority = priority
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._idents: set[int] = set()
        self._starting = threading.Lock()

    def submit(self, work: Callable[..., T], *args: Any) -> Future[T]:
        with self._starting:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name,
                                                initializer=self._started)
            return self._pool.submit(work, *args)

    @property
    def on_its_thread(self) -> bool:
        """Whether the caller is one of this worker's threads."""
        return threading.get_ident() in self._idents

    def stop(self, wait: bool = True, cancel: bool = False) -> None:
        """End the threads after the work handed over (``cancel``: what has not started is
        dropped); ``wait`` for them. A later ``submit`` starts them again."""
        with self._starting:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait and not self.on_its_thread, cancel_futures=cancel)

    def _started(self) -> None:
        self._idents.add(threading.get_ident())
        if self.priority == IDLE:
            background_thread()


SECOND_CTRL_C_EXIT = 130  # what a shell reports for a process ended by Ctrl-C
SECOND_CTRL_C = ("hpckit: a second Ctrl-C during a step that must complete (a manifest write): "
                 "ending now, without releasing the experiment's lock (it goes stale, as a "
                 "killed run's); run hpckit verify before resuming\n")


@contextmanager
def deferred() -> Iterator[None]:
    """Run the block whole; a Ctrl-C that comes during it is raised right after it, and a
    second one ends the process at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # interrupts are raised in the main thread only
        return
    pressed: list[Any] = []

    def held(*args: Any) -> None:
        if pressed:
            # Straight to stderr: in a signal handler, a logging handler's lock may be held.
            os.write(2, SECOND_CTRL_C.encode())
            os._exit(SECOND_CTRL_C_EXIT)
        pressed.append(args)

    previous = signal.signal(signal.SIGINT, held)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed and callable(previous):
        previous(*pressed[0])
    elif pressed and previous == signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)


def waited(future: Future[T]) -> T:
    """The outcome of a step that another thread makes (the experiment's writer), waited for
    under :func:`deferred` from the main thread: the wait is where signal handlers run, so a
    second Ctrl-C is heard even while the step is inside C code (pyarrow's S3 PUT), where the
    main thread itself would run no handler until the call returned."""
    if threading.current_thread() is threading.main_thread():
        with deferred():
            wait_for([future])
    return future.result()
