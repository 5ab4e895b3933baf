"""Signals that reach the process which started the ranks (``hpckit run``, ``python
train.py``) and what it does with them while it waits for mpiexec.

The stop signal goes to the ranks themselves, since mpiexec (hydra) would die of SIGUSR2
instead of forwarding it (Hydra forwards SIGUSR1 and SIGALRM, which is how
slurm/mpirun.sbatch passes Slurm's warning on); mpiexec and its proxies are started with it
ignored, because Slurm signals every process of a job step. SIGTERM goes to mpiexec, which passes it to the
ranks: they stop after their next checkpoint. SIGHUP (the terminal closing) counts as
SIGTERM, so a closed terminal does not orphan the ranks. A second SIGTERM (or SIGHUP) more
than :data:`INSIST_AFTER_S` after the first kills the ranks: a rank blocked in a collective
never reaches its next report. Copies of one signal (from Slurm and from a shell) come
together and count as one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import Any

INSIST_AFTER_S = 5.0
_passed_on: list[int] = []  # the stop signals and SIGTERMs this process passed to its ranks


def stop_passed_on() -> bool:
    """Whether this process passed a stop (the stop signal, SIGTERM) on to ranks it runs: they
    are committing to stop, and an elastic run does not give their step up to grow."""
    return bool(_passed_on)


def signal_ranks(pids: str, signum: int) -> bool:
    """Send ``signum`` to every rank that recorded its PID in ``pids``; whether there was one."""
    sent = False
    for name in os.listdir(pids):
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(name), signum)
            sent = True
    return sent


class Forwarding:
    """While mpiexec runs: the signals above go where they should. ``terminated`` says
    whether a SIGTERM (or SIGHUP) came, so that the caller does not restart the ranks."""

    def __init__(self, process: subprocess.Popen[bytes], pids: str, stop: signal.Signals,
                 launcher_passes_stop: bool = False):
        self.process = process
        self.pids = pids
        self.stop = stop
        self.launcher_passes_stop = launcher_passes_stop
        self.terminated_at: float | None = None
        self._previous: dict[signal.Signals, Any] = {}

    @property
    def terminated(self) -> bool:
        return self.terminated_at is not None

    def __enter__(self) -> Forwarding:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._forward)
                              for s in {signal.SIGTERM, signal.SIGHUP, self.stop}}
        return self

    def __exit__(self, *_: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _forward(self, signum: int, _frame: Any) -> None:
        _passed_on.append(signum)
        if signum == self.stop and signum != signal.SIGTERM:
            if self.launcher_passes_stop:
                self.process.send_signal(signum)
            else:
                signal_ranks(self.pids, signum)
            return
        now = time.monotonic()
        if self.terminated_at is None:
            self.terminated_at = now
            self.process.send_signal(signal.SIGTERM)
        elif now - self.terminated_at > INSIST_AFTER_S:
            signal_ranks(self.pids, signal.SIGKILL)
            self.process.kill()
