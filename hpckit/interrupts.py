"""Ctrl-C held back while a step that must not be cut in two completes (ground layer).

Replacing the manifest and remembering the replacement is one such step: an interrupt that
landed between the two would make the owner later write back the manifest it had replaced,
forgetting a checkpoint already committed.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def deferred() -> Iterator[None]:
    """Run the block whole; a Ctrl-C that comes during it is raised right after it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # interrupts are raised in the main thread only
        return
    pressed: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda *args: pressed.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed and callable(previous):
        previous(*pressed[0])
    elif pressed and previous == signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)
