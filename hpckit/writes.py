"""The saves still writing into local directories (ground layer): ``hpckit.torch.save_state``
and DCP's ``async_save`` hand their waits here as they start, so that ``report()`` waits for
every file of a checkpoint directory before it reads one, however the checkpoint object
was made; and which files a rank writes itself into a directory every rank shares."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

_writes: dict[str, list[tuple[str, Callable[[], Any]]]] = {}
_writes_lock = threading.Lock()


def writing_into(directory: str, name: str, wait: Callable[[], Any]) -> None:
    """A save that is still writing the file ``name`` into the local ``directory``
    (``hpckit.torch.save_state``): ``report()`` calls ``wait()`` before it reads a checkpoint
    of that directory."""
    with _writes_lock:
        _writes.setdefault(os.path.realpath(directory), []).append((name, wait))


def claim(directory: str, name: str) -> None:
    """The file ``name`` in the local ``directory`` (a checkpoint written in place) is this
    rank's own, written before ``report()``: this rank hashes it, and the manifest records it
    as its writer, whichever other ranks hand the same directory."""
    writing_into(directory, name, lambda: None)


def written_later(directory: str) -> tuple[str, ...]:
    """The files this process's saves write into ``directory`` after ``report()`` returns:
    in a directory that every rank shares, only this rank may hash them."""
    with _writes_lock:
        return tuple(name for name, _ in _writes.get(os.path.realpath(directory), []))


def waits_for(directory: str) -> list[Callable[[], Any]]:
    """The waits of every save still writing into the local ``directory``, taken: the caller
    calls each."""
    with _writes_lock:
        return [pending for _, pending in _writes.pop(os.path.realpath(directory), [])]
