"""Starting ranks under mpiexec on this node and waiting for them: ``hpckit run``, ``hpckit
resume`` and ``fit()`` from ``python train.py`` all come here.

Signals that reach the process which started the ranks (``hpckit run``, ``python
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
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpckit import exits
from hpckit.errors import LaunchError
from hpckit.logs import log
from hpckit.processes import ended_with
from hpckit.run.ending.exit import INTERRUPT_GRACE
from hpckit.run.ending.stop import ignored
from hpckit.run.mpi import library
from hpckit.run.startup.early import process_started
from hpckit.run.startup.shm import remove_left_by_ranks
from hpckit.settings import Settings, variable

STOP_MARGIN = 5.0  # after Ctrl-C, beyond the ranks' own grace: rank 0 records and closes
POLL_S = 0.5  # how often a launcher that may wait for lost ranks is asked about
# The launcher was killed because it waited for lost ranks: never a process's own status
# (0-255, or a negative signal number), so never taken for srun's 137 when a task was killed.


def find_mpiexec(settings: Settings) -> str | None:
    """The mpiexec hpckit starts ranks with: HPCKIT_MPIEXEC, else the one next to Python
    (the mpich wheel's, in a virtualenv), else the first on PATH."""
    return (settings.mpiexec or shutil.which("mpiexec", path=os.path.dirname(sys.executable))
            or shutil.which("mpiexec"))


def launcher_version(found: str) -> str:
    """What ``found --version`` prints; raises OSError (or TimeoutExpired) if it cannot run."""
    return subprocess.run([found, "--version"], capture_output=True, text=True,
                          timeout=30).stdout


@dataclass(frozen=True)
class Launch:
    """The command that starts the ranks, and the signal its launcher gets when hpckit's
    driver dies however it dies: a stop request that the launcher passes on to the ranks.
    ``signals_tasks``: the launcher passes every signal on to the ranks itself, wherever
    they run (srun); mpiexec's ranks, all on this node, are signalled by their PIDs."""

    command: tuple[str, ...]
    on_driver_death: int = signal.SIGTERM
    signals_tasks: bool = False


def mpiexec(settings: Settings, ranks: int, program: list[str]) -> Launch:
    """mpiexec starting ``ranks`` ranks of ``program`` on this node, with the flags its MPI
    needs. MPICH's launcher passes SIGTERM on to the ranks; Open MPI's aborts the job on
    SIGTERM and passes the stop signal on instead."""
    found = find_mpiexec(settings)
    if not found:
        raise LaunchError(
            "num_workers > 1 needs mpiexec to start the ranks, and none was found next to "
            f"{sys.executable} or on PATH; pip install mpich, or set {variable('mpiexec')}.")
    asked = library.ask()
    try:
        version = launcher_version(found)
    except (OSError, subprocess.TimeoutExpired) as exc:
        asked.kill()
        asked.wait()
        raise LaunchError(f"cannot run {found} --version: {exc}") from None
    _same_mpi(found, version, asked)
    ranked = ("-n", str(ranks), *program)
    kind = library.implementation(version)
    # Hydra (MPICH's, Intel MPI's) would use the Slurm allocation's nodes; hpckit starts
    # ranks on this node only.
    if kind in ("MPICH", "Intel MPI"):
        return Launch((found, "-launcher", "fork", *ranked))
    if kind == "Open MPI":
        return Launch((found, *_open_mpi(found, ranks), *ranked), settings.stop_signal)
    return Launch((found, *ranked))


def _same_mpi(found: str, version: str, asked: subprocess.Popen[str]) -> None:
    """Ranks started by another MPI's launcher would each run as a world of one."""
    try:
        loaded = library.answer(asked)
    except (OSError, subprocess.SubprocessError):
        return  # mpi4py's own import error is reported by the ranks, with its context
    launch, library_of = library.implementation(version), library.implementation(loaded)
    if launch and library_of and launch != library_of:
        raise LaunchError(
            f"{found} is {launch}'s launcher, but mpi4py loads {library_of} ({loaded}): the "
            f"ranks it started would each run alone. Put {library_of}'s mpiexec first on PATH "
            f"or set {variable('mpiexec')} to it (or install mpi4py for {launch}).")


def _open_mpi(found: str, ranks: int) -> list[str]:
    """Open MPI refuses root unless the user allows it (the variables are its own), and more
    ranks than cores unless told to oversubscribe."""
    allowed = all(os.environ.get(name) == "1" for name in
                  ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"))
    if os.geteuid() == 0 and not allowed:
        raise LaunchError(
            f"{found} is Open MPI's, which refuses to start ranks as root; run as another "
            "user, or allow it with OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
            "in the environment.")
    return ["--oversubscribe"] if ranks > len(os.sched_getaffinity(0)) else []


def started_for(attempt: int, settings: Settings) -> str:
    """For the ranks' "ready in": the start of the command, or of this restart."""
    return repr(process_started(settings) if attempt == 0 else time.time())


def run_process(launch: Launch, extra_env: dict[str, str], settings: Settings,
                cwd: str | None = None, seen: list[int] | None = None,
                abandon: Callable[[], bool] | None = None) -> int:
    """Run the ranks' launcher and wait; its exit status, or exits.TERMINATED where a SIGTERM
    that reached this process ended the ranks before they stopped by themselves.

    The launcher runs in a session of its own, so a terminal's Ctrl-C reaches this process
    alone, which passes it to the ranks themselves (mpiexec would print two lines of its own,
    and take a second Ctrl-C as "force abort" while rank 0 still records the interrupt).
    Other signals: the module's docstring. Ranks record their PIDs in
    $HPCKIT_PID_DIR; ``seen`` receives them. ``abandon``, asked every :data:`POLL_S` while
    the ranks run, says when to give up waiting for a launcher that waits for lost ranks:
    it is killed, and the status is :data:`exits.ABANDONED`."""
    pids = tempfile.mkdtemp(prefix="hpckit-pids-")
    recorded = {} if launch.signals_tasks else {variable("pid_dir"): pids}
    with ignored(settings.stop_signal):  # the ranks install their own handler
        process = subprocess.Popen(launch.command, env={**os.environ, **extra_env, **recorded},
                                   cwd=cwd, start_new_session=True,
                                   preexec_fn=ended_with(os.getpid(), launch.on_driver_death))
    try:
        with Forwarding(process, pids, settings.stop_signal,
                        launch.signals_tasks) as forwarding:
            code = _wait(process, pids, abandon, launch.signals_tasks)
        stopped = code in (0, exits.STOPPED, exits.INTERRUPTED)
        if forwarding.terminated and not stopped:
            return exits.TERMINATED
        return _not_from_here(launch, code)
    finally:
        ranks, segments = _registered(pids)
        if seen is not None:
            seen[:] = ranks
        shutil.rmtree(pids, ignore_errors=True)
        remove_left_by_ranks(ranks, segments)


def _registered(pids: str) -> tuple[list[int], list[str]]:
    """The PIDs the ranks recorded in ``pids``, and the shared memory segments they named."""
    ranks, segments = [], []
    for name in os.listdir(pids):
        if name.isdigit():
            ranks.append(int(name))
            with contextlib.suppress(OSError):
                with open(os.path.join(pids, name)) as f:
                    segments += f.read().split()
    return ranks, segments


def _not_from_here(launch: Launch, code: int) -> int:
    """A launcher's 143 where no SIGTERM reached this process: the launcher ended the ranks
    itself (srun, as Slurm ends a job step whose node failed). That is a failure, where 143
    alone reads as a termination passed on from here, which is never restarted."""
    if code != exits.TERMINATED:
        return code
    log.warning("%s ended the ranks with SIGTERM, which did not come from here (Slurm ends a "
                "job step so when one of its nodes fails): taken as a failure",
                launch.command[0].rsplit("/", 1)[-1])
    return exits.FAILED


def _wait(process: subprocess.Popen[bytes], pids: str, abandon: Callable[[], bool] | None,
          signals_tasks: bool) -> int:
    try:
        return _ended(process, abandon)
    except KeyboardInterrupt:
        _interrupted(process, pids, signals_tasks)
        raise
    except BaseException:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        raise


def _ended(process: subprocess.Popen[bytes], abandon: Callable[[], bool] | None) -> int:
    if abandon is None:
        return process.wait()
    while True:
        try:
            return process.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            if abandon():
                process.kill()
                process.wait()
                return exits.ABANDONED


def _interrupted(process: subprocess.Popen[bytes], pids: str, signals_tasks: bool) -> None:
    """Ctrl-C reached this process: pass it to the ranks, which stop by themselves once rank
    0 has recorded it. A second Ctrl-C, or ranks that do not end in time, are killed. srun
    takes one Ctrl-C as a request for its tasks' state: two within a second pass it on."""
    def kill(*_: Any) -> None:
        signal_ranks(pids, signal.SIGKILL)
        process.kill()

    previous = signal.signal(signal.SIGINT, kill)
    try:
        if signals_tasks:
            process.send_signal(signal.SIGINT)
            process.send_signal(signal.SIGINT)
        elif not signal_ranks(pids, signal.SIGINT):
            process.send_signal(signal.SIGINT)  # no rank is up yet: mpiexec passes it on
        try:
            process.wait(timeout=INTERRUPT_GRACE + STOP_MARGIN)
        except subprocess.TimeoutExpired:
            kill()
            process.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


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
