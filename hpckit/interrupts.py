"""Ctrl-C held back while a step that must not be cut in two completes (ground layer).

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
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

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
