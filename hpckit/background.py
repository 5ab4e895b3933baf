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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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
