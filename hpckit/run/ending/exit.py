"""The rank side of a failed run: how a rank ends so that no other rank is left waiting, and
the error payload it leaves for the process that launched it (see :mod:`hpckit.launch`).

Telling MPICH's mpiexec (hydra) that a rank is done with MPI when MPI_Finalize cannot run.

Hydra ends every rank of a job as soon as one exits without having finalized MPI, and prints
a "BAD TERMINATION" banner for each rank it had to kill. After Ctrl-C the ranks exit without
MPI_Finalize (a collective may have been left half done; finalizing would fail or wait) at
about the same moment, but not the same one, and a rank a few milliseconds late was killed.
So each rank first says ``finalize`` on its PMI-1 connection to hydra, as MPI_Finalize does
at its end; hydra then takes each rank's own exit status and kills nothing. Only on hydra's
connection: Slurm's PMI-2 (srun) speaks another protocol on its PMI_FD and is left alone.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from hpckit import exits, logs, uncaught
from hpckit.errors import ExperimentTakenError, TrainingFailedError, WorkerGroupError
from hpckit.logs import log
from hpckit.processes import stat
from hpckit.run.ending import stop
from hpckit.run.mpi.comm import RankFailure, describe, failed_ranks, world
from hpckit.run.mpi.waiting import meet_within, wait_for_all
from hpckit.settings import Settings

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

ABORT_GRACE = 0.5
INTERRUPT_GRACE = 2.0
ERRORS = "errors"

# A communicator of its own for the ranks to meet on after Ctrl-C: the others may have been
# interrupted inside one of hpckit's collectives, which a meeting there could be taken for.
_interrupts: Comm | None = None


@dataclass(frozen=True)
class ErrorReport:
    """One rank's failure as handed to the launching process."""

    failure: RankFailure
    training: bool


def resume_hint(experiment: str, rerun_resumes: bool) -> str:
    """What a failed run says last: how to continue from its last committed checkpoint."""
    return ("training failed; to resume from its last committed checkpoint, "
            + stop.how_to_resume(experiment, rerun_resumes))


def fail(comm: Comm, settings: Settings, exc: BaseException, collective: bool,
         training: bool, resume: str = "") -> NoReturn:
    """End this rank's part in a failed run; the others must not be left waiting.

    An error every rank raised together is raised on each rank. An error of one rank alone
    is logged with its traceback and the whole MPI job is aborted, since the other ranks may
    be blocked in a collective that this rank will never join. ``resume`` (a
    :func:`resume_hint`) is said last when no restart follows.
    """
    error = as_raised(exc, training, collective, comm)
    handed = settings.worker is not None and write_error(
        settings.worker, ErrorReport(RankFailure.capture(comm.rank, error), training))
    if collective or comm.size == 1:
        if comm.rank == 0 and resume and not (settings.worker or settings.restarts):
            log.error("%s", resume)
        if handed or (comm.rank != 0 and not settings.worker):
            uncaught.shown_elsewhere(error)  # by the launching process, or by rank 0
        raise error from exc
    hint = "" if settings.worker or settings.restarts or not resume else "\n" + resume
    # A start-up error is one line (its message names the fix); training errors are the user's
    # code, and their traceback says where.
    told = (RankFailure.capture(comm.rank, exc).traceback.rstrip() if training or logs.debugging()
            else f"{type(exc).__name__}: {exc}")
    log.error("rank %d failed; aborting all %d ranks.\n%s%s", comm.rank, comm.size, told, hint)
    for handler in log.handlers:
        handler.flush()
    sys.stderr.flush()
    # MPI_Abort kills at once; give the launcher a moment to forward this rank's output,
    # or the one message that says what failed can be lost.
    time.sleep(ABORT_GRACE)
    world().Abort(1)
    raise SystemExit(1)  # not reached: Abort ends the process


def taken(comm: Comm, settings: Settings, error: ExperimentTakenError) -> NoReturn:
    """Another run took the experiment over and every rank raised ``error`` together: never
    restarted and no resume hint, since the experiment is that run's now. Each rank hands
    the error to the process that launched it, and all raise it at once: uncaught, each exits
    :data:`exits.TAKEN` without MPI_Finalize, and mpiexec would kill (status 9) the ranks
    still running when the first one exits so: they leave together, each telling hydra first,
    as a stopped run's ranks do."""
    if settings.worker:
        write_error(settings.worker, ErrorReport(RankFailure.capture(comm.rank, error), True))
    if settings.worker or comm.rank != 0:
        uncaught.shown_elsewhere(error)  # said once: by the launching process, or by rank 0
    else:
        uncaught.say_now(error)  # before any rank leaves the meeting below and exits 77
    _flush()
    wait_for_all(comm, together=True)
    finalize_with_hydra()
    raise error


def as_raised(exc: BaseException, training: bool, collective: bool, comm: Comm) -> BaseException:
    """What fit() raises: setup errors as they are, training errors as a WorkerGroupError
    (a TrainingFailedError, as in Ray) that maps each failed rank to its exception."""
    if not training or isinstance(exc, TrainingFailedError):
        return exc
    if collective and comm.size > 1:
        return WorkerGroupError(
            f"training failed on all {comm.size} ranks: {type(exc).__name__}: {exc}",
            failed_ranks(exc) or dict.fromkeys(range(comm.size), exc))
    return WorkerGroupError(describe([RankFailure.capture(comm.rank, exc)], "training"),
                            {comm.rank: exc})


def write_error(payload: str, report: ErrorReport) -> bool:
    """Hand this rank's error to the process that started it; whether that worked."""
    path = os.path.join(payload, ERRORS, f"rank-{report.failure.rank}.pkl")
    try:
        with open(path + ".tmp", "wb") as f:
            pickle.dump(report, f)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        log.error("could not hand the error to the launching process: %s", exc)
        return False
    return True


def read_errors(payload: str) -> list[ErrorReport]:
    """Every rank's error report in ``payload``, lowest rank first."""
    folder = os.path.join(payload, ERRORS)
    reports = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".pkl"):
            with open(os.path.join(folder, name), "rb") as f:
                reports.append(pickle.load(f))
    return sorted(reports, key=lambda r: r.failure.rank)


def register_pid(settings: Settings, segments: list[str] | None = None) -> None:
    """Let the process that launched this rank send it the stop signal; once MPI runs,
    with the names of the shared memory segments this rank's MPI made (one a line), which
    the launcher removes if the rank dies and leaves them (and no others)."""
    if not settings.pid_dir:
        return
    path = os.path.join(settings.pid_dir, str(os.getpid()))
    try:
        with open(path, "w") as f:
            f.write("".join(f"{name}\n" for name in segments or ()))
    except OSError as exc:
        log.warning("could not write %s (%s): the process that launched this rank cannot pass "
                    "it Ctrl-C or the stop signal, so the rank may outlive it; make %s "
                    "writable (HPCKIT_PID_DIR)", path, exc, settings.pid_dir)


def prepare_interrupts(comm: Comm) -> None:
    """Every rank, once its world is up: the communicator that :func:`interrupted` uses."""
    global _interrupts
    if _interrupts is not None:  # an earlier fit()'s in this process: collective, as this is
        _interrupts.Free()
    _interrupts = comm.Dup()


def interrupted(exc: KeyboardInterrupt, meeting: Comm | None = None) -> NoReturn:
    """End this rank after Ctrl-C, promptly: the attempt was recorded interrupted (rank 0)
    and the one line said how to resume. One rank alone re-raises the interrupt, so a
    program's ``except KeyboardInterrupt`` still sees it. Several ranks wait a moment for
    one another (rank 0 may still be recording), then each exits with status 130 at once,
    since a rank stopped inside a collective would wait forever for the others. When all
    met, each tells hydra first (:func:`finalize_with_hydra`); else hydra ends those that did not
    come as the first rank exits. ``meeting``: the ranks to meet (default: the run's; a sweep
    gives its whole world)."""
    stop.exit_on_next_interrupt()
    uncaught.shown_elsewhere(exc)
    comm = meeting if meeting is not None else _interrupts
    if comm is None or comm.size == 1:
        stop.interrupt_handled()
        raise exc
    _leave_together(comm, exits.INTERRUPTED)


def requeued(comm: Comm) -> NoReturn:
    """Every rank of a requeued job exits 75 at once, without MPI_Finalize: Slurm ends the
    job's steps as it requeues it, and a rank it ended first would hold MPI_Finalize on the
    others until Slurm's KillWait ran out (30 s and more before the job starts again). The
    ranks meet for a moment first; when all met, each tells hydra it is leaving (``python
    train.py`` in an allocation starts its ranks with mpiexec), as after Ctrl-C."""
    _leave_together(comm, exits.STOPPED)


def _leave_together(comm: Comm, status: int) -> NoReturn:
    """Exit with ``status`` at once, without MPI_Finalize, after meeting the other ranks for
    at most :data:`INTERRUPT_GRACE`; when all met, each tells hydra first. One that did not
    come is left to the launcher."""
    _flush()
    if meet_within(comm, INTERRUPT_GRACE):
        finalize_with_hydra()
    os._exit(status)


def requeued_now() -> NoReturn:
    """Exit 75 at once, without MPI_Finalize: in a sweep packed into one job, a trial's ranks
    stop for the requeue while others may already have been ended by Slurm, and finalizing
    would wait for them until Slurm's KillWait ran out."""
    _flush()
    os._exit(exits.STOPPED)


def _flush() -> None:
    for handler in log.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()


ACK_WAIT_S = 1.0
HYDRA_PROXY = "hydra_pmi_proxy"


def finalize_with_hydra() -> bool:
    """Whether hydra acknowledged this rank's finalize; False, with nothing sent, where the
    rank was not started by hydra."""
    fd = hydra_connection()
    if fd is None:
        return False
    try:
        os.write(fd, b"cmd=finalize\n")
        ready, _, _ = select.select([fd], [], [], ACK_WAIT_S)
        return bool(ready) and os.read(fd, 256).startswith(b"cmd=finalize_ack")
    except OSError:
        return False


def hydra_connection() -> int | None:
    """``PMI_FD`` where hydra's proxy holds its other end; None elsewhere.

    The variables do not say who listens: a job submitted from inside an ``mpiexec`` rank
    inherits hydra's ``MPI_LOCALRANKID``, and under ``srun --mpi=pmi2`` slurmstepd holds
    ``PMI_FD``. Hydra's PMI-1 words on that connection are a malformed request to Slurm's
    PMI-2 server, so the socket's peer is asked instead."""
    fd = os.environ.get("PMI_FD", "")
    if not fd.isdigit():
        return None
    try:
        with socket.socket(fileno=os.dup(int(fd))) as connection:
            credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                struct.calcsize("3i"))
    except OSError:  # closed, or not a socket
        return None
    peer = stat(struct.unpack("3i", credentials)[0])
    return int(fd) if peer is not None and peer.name == HYDRA_PROXY else None
