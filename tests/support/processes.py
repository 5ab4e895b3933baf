"""The process trees the tests start: what runs under a launched command, and ending all of it.

hpckit's launcher starts mpiexec in a session of its own, and mpiexec's proxy (hydra_pmi_proxy)
starts the ranks in another: killing the command's process group leaves them running, and
holding the command's output pipe open. The tree is found by parent (:mod:`hpckit.processes`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

from hpckit.processes import children, stat


def descendants(root: int) -> list[int]:
    """Every live process under ``root``, parents before their children."""
    found = []
    for child in children(root):
        found += [child.pid, *descendants(child.pid)]
    return found


def tree(root: int) -> dict[int, tuple[str, int]]:
    """``root`` and its descendants: each one's state and process group."""
    found = {}
    for pid in [root, *descendants(root)]:
        process = stat(pid)
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            continue
        if process is not None:
            found[pid] = (process.state, group)
    return found


def kill_tree(root: int) -> None:
    """SIGKILL ``root``, everything under it and their process groups, by PID. The tree is
    read first: a process whose parent died is no longer found under ``root``."""
    found = tree(root)
    for group in {group for _, group in found.values()}:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def ended_at_exit(process: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``process``, started with ``start_new_session=True``, and its process group SIGKILLed
    when the block leaves while it still runs (a failed assertion, a timeout)."""
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
