"""Starting ranks under mpiexec on this node and waiting for them: ``hpckit run``, ``hpckit
resume`` and ``fit()`` from ``python train.py`` all come here."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

from hpckit import settings as _settings
from hpckit.errors import LaunchError
from hpckit.experiment.hangs import HUNG
from hpckit.launch.forwarding import (
    EXIT_TERMINATED,
    Forwarding,
    signal_ranks,
)
from hpckit.logs import log
from hpckit.processes import ended_with
from hpckit.run.ending.exit import EXIT_TAKEN, INTERRUPT_GRACE
from hpckit.run.ending.hang import EXIT_HUNG
from hpckit.run.ending.retry import RetryPolicy
from hpckit.run.ending.stop import EXIT_INTERRUPTED, EXIT_STOPPED, ignored
from hpckit.run.mpi import library
from hpckit.run.startup.early import process_started
from hpckit.run.startup.shm import remove_left_by_ranks
from hpckit.settings import Settings, variable
from hpckit.storage.uris import redact

STOP_MARGIN = 5.0  # after Ctrl-C, beyond the ranks' own grace: rank 0 records and closes


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
    driver dies however it dies: a stop request that the launcher passes on to the ranks."""

    command: tuple[str, ...]
    on_driver_death: int = signal.SIGTERM


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


def run_script(ranks: int, argv: list[str], policy: RetryPolicy, cwd: str | None = None,
               extra_env: dict[str, str] | None = None) -> int:
    """``hpckit run``: start ``ranks`` ranks of a script under mpiexec, restarting it after a
    failure as ``policy`` allows; each attempt resumes from the manifest. Returns the exit
    status: 0, EXIT_STOPPED, EXIT_TAKEN (another run took the experiment over: never
    restarted), or the last failure's."""
    settings = _settings.current()
    launch = mpiexec(settings, ranks, [sys.executable, *argv])
    ids = {variable("run_id"): settings.run_id or f"run-{uuid.uuid4().hex}"}
    attempt = 0
    failed: dict[str, str] = {}
    seen: list[int] = []
    while True:
        log.info("starting %d rank(s): %s", ranks, redact(" ".join(launch.command)))
        try:
            code = run_process(launch, {**(extra_env or {}), **ids, **failed,
                                         variable("attempt"): str(attempt),
                                         variable("restarts"): str(int(policy.allows(attempt))),
                                         variable("started_at"): started_for(attempt, settings)},
                               settings, cwd, seen)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED  # rank 0 said what was kept and how to resume
        if code in (0, EXIT_STOPPED, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_TAKEN) or \
                not policy.allows(attempt):
            return code
        attempt += 1
        failed = _failure_of(code, seen)
        log.warning("the ranks exited with status %d; restarting (%s)", code,
                    policy.describe(attempt))


def _failure_of(code: int, pids: list[int]) -> dict[str, str]:
    """What the next attempt records of this one, whose ranks ended with ``code``."""
    said = (HUNG if code == EXIT_HUNG else
            f"the ranks exited with status {code}; the failed rank's error is in the run's output")
    return {variable("previous_failure"): said, variable("previous_pids"): ",".join(map(str, pids)),
            variable("previous_hung"): str(int(code == EXIT_HUNG))}


def started_for(attempt: int, settings: Settings) -> str:
    """For the ranks' "ready in": the start of the command, or of this restart."""
    return repr(process_started(settings) if attempt == 0 else time.time())


def run_process(launch: Launch, extra_env: dict[str, str], settings: Settings,
                cwd: str | None = None, seen: list[int] | None = None) -> int:
    """Run the ranks' launcher and wait; its exit status, or EXIT_TERMINATED where a SIGTERM
    that reached this process ended the ranks before they stopped by themselves.

    The launcher runs in a session of its own, so a terminal's Ctrl-C reaches this process
    alone, which passes it to the ranks themselves (mpiexec would print two lines of its own,
    and take a second Ctrl-C as "force abort" while rank 0 still records the interrupt).
    Other signals: :mod:`hpckit.launch.forwarding`. Ranks record their PIDs in
    $HPCKIT_PID_DIR; ``seen`` receives them."""
    pids = tempfile.mkdtemp(prefix="hpckit-pids-")
    started = time.time()
    with ignored(settings.stop_signal):  # the ranks install their own handler
        process = subprocess.Popen(launch.command, env={**os.environ, **extra_env,
                                                 variable("pid_dir"): pids}, cwd=cwd,
                                   start_new_session=True,
                                   preexec_fn=ended_with(os.getpid(), launch.on_driver_death))
    try:
        with Forwarding(process, pids, settings.stop_signal) as forwarding:
            code = _wait(process, pids)
        stopped = code in (0, EXIT_STOPPED, EXIT_INTERRUPTED)
        return EXIT_TERMINATED if forwarding.terminated and not stopped else code
    finally:
        ranks = [int(name) for name in os.listdir(pids) if name.isdigit()]
        if seen is not None:
            seen[:] = ranks
        shutil.rmtree(pids, ignore_errors=True)
        remove_left_by_ranks(started, ranks)


def _wait(process: subprocess.Popen[bytes], pids: str) -> int:
    try:
        return process.wait()
    except KeyboardInterrupt:
        _interrupted(process, pids)
        raise
    except BaseException:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        raise


def _interrupted(process: subprocess.Popen[bytes], pids: str) -> None:
    """Ctrl-C reached this process: pass it to the ranks, which stop by themselves once rank
    0 has recorded it. A second Ctrl-C, or ranks that do not end in time, are killed."""
    def kill(*_: Any) -> None:
        signal_ranks(pids, signal.SIGKILL)
        process.kill()

    previous = signal.signal(signal.SIGINT, kill)
    try:
        if not signal_ranks(pids, signal.SIGINT):
            process.send_signal(signal.SIGINT)  # no rank is up yet: mpiexec passes it on
        try:
            process.wait(timeout=INTERRUPT_GRACE + STOP_MARGIN)
        except subprocess.TimeoutExpired:
            kill()
            process.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
