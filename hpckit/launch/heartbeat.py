"""Each node of a run started across a Slurm allocation says that it is alive: the first rank
of every node touches a file named for the node in the launch's shared folder every
:data:`BEAT_S` (:mod:`hpckit.run.startup.watchdog`), and the process that launched the ranks
(``python train.py``'s, ``hpckit run``, ``hpckit resume``) takes a node whose file is older
than :data:`STALE_S` for a suspect (:mod:`hpckit.launch.steps` then asks its slurmd). A rank
blocked in a collective still beats (the beat is a thread of its own); a node that is gone
does not.

One file per node, not per rank: at 1,000 nodes, 500 small writes a second to the shared
filesystem, and the driver lists one folder every :data:`BEAT_S`.
"""

from __future__ import annotations

import os
import time

from hpckit.run.startup.watchdog import BEAT_S

STALE_S = 8.0
FOLDER = "alive"
__all__ = ["BEAT_S", "FOLDER", "STALE_S", "stale"]


def stale(folder: str, nodes: tuple[str, ...]) -> tuple[str, ...]:
    """Which of ``nodes`` have beaten, but not for :data:`STALE_S`."""
    now = time.time()
    found = []
    for node in nodes:
        try:
            if now - os.stat(os.path.join(folder, node)).st_mtime > STALE_S:
                found.append(node)
        except FileNotFoundError:
            pass  # not started yet: start-up has its own timeout
    return tuple(found)
