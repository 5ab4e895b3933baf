"""Whether a process of this host is alive: for locks and shared downloads (ground layer)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether a process of this host still runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed rank whose parent died first stays a zombie until something reaps it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
