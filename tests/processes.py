"""The process trees the tests start: what runs under a launched command, and ending all of it.

hpckit's launcher starts mpiexec in a session of its own, and mpiexec's proxy (hydra_pmi_proxy)
starts the ranks in another: killing the command's process group leaves them running, and
holding the command's output pipe open. The tree is found by parent, from /proc."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def tree(root: int) -> dict[int, tuple[str, int]]:
    """``root`` and its descendants: each one's state and process group."""
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        stats[int(pid)] = (fields[0], int(fields[1]), int(fields[2]))  # state, parent, group
    found, parents = {}, [root]
    while parents:
        pid = parents.pop()
        if pid in stats:
            found[pid] = (stats[pid][0], stats[pid][2])
            parents += [child for child, (_, parent, _) in stats.items() if parent == pid]
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
