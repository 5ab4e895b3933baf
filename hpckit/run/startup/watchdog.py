"""No hang at start-up: a rank whose peers cannot all join MPI ends instead of waiting.

``MPI_Init`` and the first collectives wait for every rank. A rank that died before or
during them (an import error, a bad node, a requeue's leftovers) leaves the others waiting
until the job's time limit, unless the user passed ``srun --kill-on-bad-exit``. From the
moment a rank starts hpckit until its first collectives are done, a thread watches the
rank's siblings (the processes its launcher, slurmstepd or hydra's proxy, started on this
node): when one exits, or fewer run than the launcher started, the rank logs which rank
died and exits. Peers on other nodes are not visible: if they never join, the rank gives up
after ``HPCKIT_STARTUP_TIMEOUT`` seconds (600 by default; a slow shared filesystem can
make imports slow, and slowness must not be taken for death).

The watcher is a forked child process, not a thread: ``MPI_Init`` blocks holding the GIL,
so no Python thread of the rank runs while it waits. The child ends the rank with SIGTERM
(then SIGKILL) and exits as soon as the rank closes the pipe between them.

A node's heartbeat, on the rank side: where the process that launched the ranks across a
Slurm allocation asked for one (``HPCKIT_HEARTBEAT``, a folder every node sees), the first
rank of each node touches a file named for its node there every :data:`BEAT_S`, from a
thread of its own, so that a rank blocked in a collective still beats and a node that is
gone does not (the launcher's side: :mod:`hpckit.launch.heartbeat`).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from types import TracebackType

from hpckit.logs import log
from hpckit.processes import alive, children, environment_value, stat
from hpckit.settings import Settings

LAUNCHERS = ("slurmstepd", "hydra_pmi_proxy")
KILL_AFTER = 5.0
POLL = 0.5
GRACE = 10.0  # seconds for a loaded node's launcher to start the last of its ranks


class StartupWatchdog:
    """A context manager around MPI start-up; the process is ended if start-up cannot finish."""

    def __init__(self, settings: Settings, poll: float = POLL) -> None:
        self.settings = settings
        self.poll = poll
        parent = stat(os.getppid())
        self._parent = parent.pid if parent is not None and parent.name in LAUNCHERS else None
        self._expected = _local_ranks(settings)
        self._seen: dict[int, str] = {}
        self._child: int | None = None
        self._pipe: int | None = None

    def __enter__(self) -> StartupWatchdog:
        if self.settings.launcher is None or self.settings.launched_tasks == 1:
            return self
        for handler in log.handlers:
            handler.flush()
        readable, self._pipe = os.pipe()
        self._child = os.fork()
        if self._child == 0:
            os.close(self._pipe)
            try:
                self._watch(readable, os.getppid())
            finally:
                os._exit(0)
        os.close(readable)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._pipe is not None and self._child is not None:
            os.close(self._pipe)
            os.waitpid(self._child, 0)

    def _watch(self, readable: int, rank_pid: int) -> None:
        """In the child: until the rank closes the pipe (or dies), look for a reason to end it."""
        started = time.monotonic()
        while not select.select([readable], [], [], self.poll)[0]:
            if not alive(rank_pid):
                return
            problem = self._problem(time.monotonic() - started)
            if problem:
                self._end(rank_pid, problem)
                return

    def _problem(self, waited: float) -> str | None:
        if self._parent is not None:
            live = {s.pid: self._rank_of(s.pid) for s in children(self._parent)}
            gone = {pid: rank for pid, rank in self._seen.items() if pid not in live}
            self._seen.update(live)
            if gone:
                who = ", ".join(f"rank {rank} (pid {pid})" for pid, rank in sorted(gone.items()))
                return f"{who} on this node exited before MPI start-up completed"
            if self._expected and waited > GRACE and len(live) < len(self._expected):
                missing = [r for r in self._expected if r not in live.values()]
                named = (f"rank {', '.join(missing)}" if missing and "?" not in self._expected
                         else f"{len(self._expected) - len(live)} rank(s)")
                return (f"{named} of the {len(self._expected)} that the launcher started on "
                        "this node exited before MPI start-up completed")
        if waited > self.settings.startup_timeout:
            return (f"MPI start-up did not complete within {self.settings.startup_timeout:.0f} s "
                    "(HPCKIT_STARTUP_TIMEOUT): a rank on another node died or never started")
        return None

    def _rank_of(self, pid: int) -> str:
        if pid not in self._seen:
            return environment_value(pid, ("PMI_RANK", "PMIX_RANK", "SLURM_PROCID")) or "?"
        return self._seen[pid]

    def _end(self, rank_pid: int, problem: str) -> None:
        """Say why, once, straight to stderr (the child must not take the rank's locks), then
        end the rank, which may be blocked inside MPI_Init."""
        message = (f"{time.strftime('%H:%M:%S')} hpckit[rank {self.settings.launched_rank}] ERROR "
                   f"on {socket.gethostname()}: {problem}. Ending this rank instead of waiting "
                   "for it; its own output says why it ended.\n")
        os.write(2, message.encode())
        os.kill(rank_pid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_AFTER
        while alive(rank_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(rank_pid):
            os.kill(rank_pid, signal.SIGKILL)


def _local_ranks(settings: Settings) -> list[str]:
    """The ranks the launcher started on this node (their numbers where it says them)."""
    if settings.launcher == "srun" and settings.slurm_gtids:
        return settings.slurm_gtids.split(",")
    if settings.local_ranks and settings.local_ranks.isdigit():
        return ["?"] * int(settings.local_ranks)
    return []


BEAT_S = 2.0
_started: list[str] = []  # the folder this process beats into, once


def start_heartbeat(settings: Settings) -> None:
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
