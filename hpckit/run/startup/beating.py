"""A node's heartbeat, on the rank side: where the process that launched the ranks across a
Slurm allocation asked for one (``HPCKIT_HEARTBEAT``, a folder every node sees), the first
rank of each node touches a file named for its node there every :data:`BEAT_S`, from a
thread of its own, so that a rank blocked in a collective still beats and a node that is
gone does not (the launcher's side: :mod:`hpckit.launch.heartbeat`)."""

from __future__ import annotations

import os
import socket
import threading
import time

from hpckit.settings import Settings

BEAT_S = 2.0
_started: list[str] = []  # the folder this process beats into, once


def start(settings: Settings) -> None:
    """Beat into ``settings.heartbeat`` from now until the process ends, on a node's first
    rank (``SLURM_LOCALID`` 0); nothing elsewhere, or where this process beats already."""
    folder = settings.heartbeat
    if not folder or settings.slurm_localid != "0" or _started or not os.path.isdir(folder):
        return
    _started.append(folder)
    path = os.path.join(folder, socket.gethostname())

    def beat() -> None:
        while True:
            try:
                with open(path, "a"):
                    os.utime(path)
            except OSError:
                pass  # a full or lost filesystem: the launcher then asks slurmd, which answers
            time.sleep(BEAT_S)

    threading.Thread(target=beat, name="hpckit-heartbeat", daemon=True).start()
