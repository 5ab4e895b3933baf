"""Each node of a run started across a Slurm allocation says that it is alive: the first rank
of every node touches a file named for the node in the launch's shared folder every
:data:`BEAT_S`, and the driver takes a node whose file is older than :data:`STALE_S` for a
suspect (:mod:`hpckit.launch.steps` then asks its slurmd). A rank blocked in a collective
still beats (the beat is a thread of its own); a node that is gone does not.

One file per node, not per rank: at 1,000 nodes, 500 small writes a second to the shared
filesystem, and the driver lists one folder every :data:`BEAT_S`.
"""

from __future__ import annotations

import os
import threading
import time

BEAT_S = 2.0
STALE_S = 8.0
FOLDER = "alive"


def start_beating(folder: str, node: str) -> None:
    """Touch ``folder/node`` now and every :data:`BEAT_S` until the process ends."""
    path = os.path.join(folder, node)

    def beat() -> None:
        while True:
            try:
                with open(path, "a"):
                    os.utime(path)
            except OSError:
                pass  # a full or lost filesystem: the driver then asks slurmd, which answers
            time.sleep(BEAT_S)

    threading.Thread(target=beat, name="hpckit-heartbeat", daemon=True).start()


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
