"""Stop requests: a signal (Slurm's time-limit or preemption warning) asks the run to stop.

The handler only sets a flag. The ranks agree on it at the next report() (the flag rides
on the announcement every rank sends anyway), so they all stop after the same checkpoint.
After it, rank 0 asks Slurm to requeue the job, and every rank exits with exits.STOPPED.

The handler is installed as early as any hpckit code runs in a launched rank (at ``import
hpckit``, see :func:`catch_early`), so a warning that comes while the script still builds
its model is kept for the run instead of killing the rank (Python's default for
SIGUSR1/SIGUSR2 is to terminate). Before that, from the script's first line (while it
imports torch), the start-up hook that hpckit installs into site-packages notes the signal
(``run/startup/hook.py``), and ``import hpckit`` takes it over.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hpckit import exits
from hpckit.experiment.retention import score_of
from hpckit.logs import log
from hpckit.settings import Settings
from hpckit.storage.location import Location

_received: str | None = None


class StopRequested(BaseException):
    """Raised in every rank after the checkpoint that follows an agreed stop is committed.

    A BaseException, so that a training loop's ``except Exception`` does not swallow it.
    """


def received() -> str | None:
    """The name of the stop signal this process received, if any."""
    return _received


def _record(number: int, _frame: Any) -> None:
    global _received
    _received = signal.Signals(number).name


def catch_early(signum: signal.Signals) -> bool:
    """Record the stop signal from now on, where nothing else handles it yet (main thread).
    Ignored counts as unhandled: ``hpckit run`` starts mpiexec with it ignored. The start-up
    hook's handler (``run/startup/hook.py``) is taken over, with the signal it noted."""
    global _received
    try:
        current = signal.getsignal(signum)
        if current not in (signal.SIG_DFL, signal.SIG_IGN) and \
                not getattr(current, "hpckit_early", False):
            return False
        signal.signal(signum, _record)
    except ValueError:  # not the main thread
        return False
    _received = _received or getattr(sys, "hpckit_stop_received", None)
    return True


@contextmanager
def handling(signum: signal.Signals) -> Iterator[signal.Signals]:
    """Install the stop-signal handler for the duration of a run (main thread only). A
    signal caught earlier in this process (:func:`catch_early`) counts for this run."""
    global _received
    if threading.current_thread() is not threading.main_thread():
        yield signum  # stop requests cannot be handled here
        return
    previous = signal.signal(signum, _record)
    try:
        yield signum
    finally:
        _received = None
        # Slurm may send its warning up to a minute early, or twice (once per incarnation of
        # a requeued job): a USR1/USR2 warning that comes after the run has ended must not
        # kill the process while it exits. Ignored, not recorded: Python puts the default
        # back for every signal it catches when the interpreter finalizes, and the default
        # ends the process. SIGTERM and others keep what they had.
        ours = previous in (signal.SIG_DFL, _record)
        warning = signum in (signal.SIGUSR1, signal.SIGUSR2) and ours
        signal.signal(signum, signal.SIG_IGN if warning else previous)


@contextmanager
def terminations(stop_signal: signal.Signals) -> Iterator[None]:
    """While an attempt runs (from its start, once MPI is up, to its end), SIGTERM is a stop
    request too: Slurm sends it to the job steps when it preempts the job, then SIGKILL
    after the partition's GraceTime; ``scancel`` sends it, then SIGKILL after KillWait. The
    next report() commits its checkpoint and the run stops, requeued only where Slurm
    preempted the job (:func:`hpckit.run.session.preemption.not_requeued_after`). A rank that never
    reaches report() is ended by the SIGKILL that follows (or, under ``hpckit run`` and
    ``python train.py``, by a second SIGTERM to that process). Processes the rank forks
    (multiprocessing) keep SIGTERM's default."""
    def request(number: int, frame: Any) -> None:
        if _received is None:
            _record(number, frame)

    with _sigterm_handled(stop_signal, request):
        yield


@contextmanager
def _sigterm_handled(stop_signal: signal.Signals,
                     act: Callable[[int, Any], None]) -> Iterator[None]:
    """SIGTERM handled by ``act`` in this process for the block (where the stop signal is
    another, and in the main thread); a process it forks keeps SIGTERM's default."""
    if stop_signal == signal.SIGTERM or threading.current_thread() is not threading.main_thread():
        yield  # handling() has it already, or signals cannot be handled here
        return
    owner = os.getpid()

    def terminate(number: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked child that inherited the handler
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            act(number, frame)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class TerminatedAtStartUp(KeyboardInterrupt):
    """SIGTERM while the ranks start (the rendezvous, the back-end): the ranks end at once,
    as for Ctrl-C (the attempt recorded as interrupted, the ranks meeting to leave)."""


@contextmanager
def ending_at_sigterm(stop_signal: signal.Signals) -> Iterator[None]:
    """Around an attempt's start-up: a SIGTERM there (``timeout``, ``scancel``, a launcher
    giving up) ends the rank now, instead of waiting for a first report that a rank stuck in
    start-up may never make. The stop signal keeps its meaning: held, then a stop at the first
    report. Outside this block :func:`terminations` takes SIGTERM as a stop request."""
    def end(number: int, frame: Any) -> None:
        raise TerminatedAtStartUp("SIGTERM during start-up, before the first report: the "
                                  "run ends; the next resumes from its last committed checkpoint")

    if _received == signal.SIGTERM.name and stop_signal != signal.SIGTERM:
        end(signal.SIGTERM, None)  # it came as the attempt opened its experiment
    with _sigterm_handled(stop_signal, end):
        yield


@contextmanager
def ignored(signum: signal.Signals) -> Iterator[None]:
    """Around starting a child that must inherit ``signum`` ignored (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signum, before)


# Slurm's answer (ESLURM_JOB_PENDING) to a requeue of a job that is running this process:
# it is pending again, so it was requeued already.
PENDING = "Job is pending execution"


def requeue(settings: Settings) -> bool:
    """Ask Slurm to requeue this job; the requeued job resumes from the manifest. Slurm ends
    the job's steps with SIGTERM as it requeues, ``scontrol`` among them: it ignores SIGTERM,
    so that it lives to say that the requeue succeeded."""
    job = settings.job_to_requeue
    scontrol = shutil.which("scontrol")
    if not job or not scontrol:
        return False
    with ignored(signal.SIGTERM):
        out = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True,
                             timeout=60)
    if out.returncode != 0 and PENDING in out.stderr:  # several packed trials all ask
        log.info("Slurm job %s was requeued already (by another trial of this sweep, or by "
                 "Slurm); it resumes from the last committed checkpoint", job)
        return True
    if out.returncode != 0:
        log.error("scontrol requeue %s failed (%s); the job was submitted without --requeue? "
                  "Resume it by hand: hpckit resume EXPERIMENT", job, out.stderr.strip())
        return False
    log.info("requeued Slurm job %s; it resumes from the last committed checkpoint", job)
    return True


_before_interrupt: Any = None


SAME_PRESS_S = 0.25


def exit_on_next_interrupt() -> None:
    """After a first Ctrl-C, while the process stops: a second one ends it at once. One
    press often arrives twice: a terminal sends it to the whole process group, ranks
    included, and mpiexec passes on what it got; a SIGINT within SAME_PRESS_S of the first
    is that copy (a person's second press takes longer), else the rank would exit before
    the others and mpiexec would kill them."""
    global _before_interrupt
    first = time.monotonic()

    def again(*_: Any) -> None:
        if time.monotonic() - first >= SAME_PRESS_S:
            os._exit(exits.INTERRUPTED)

    try:
        previous = signal.signal(signal.SIGINT, again)
    except ValueError:  # not the main thread
        return
    if _before_interrupt is None:
        _before_interrupt = previous


def interrupt_handled() -> None:
    """The interrupt goes back to the program (``fit()`` raises it): Ctrl-C is its own again."""
    global _before_interrupt
    if _before_interrupt is not None:
        signal.signal(signal.SIGINT, _before_interrupt)
        _before_interrupt = None


def interrupted_line(experiment: Location, latest: str | None, rerun_resumes: bool) -> str:
    """The one line a person sees after Ctrl-C: what is kept (``latest``, the newest
    checkpoint's directory), and how to go on."""
    kept = (f"the latest committed checkpoint is {experiment.join(latest).display}" if latest
            else "no checkpoint was committed")
    return f"interrupted; {kept}. To resume, {how_to_resume(experiment.display, rerun_resumes)}"


def how_to_resume(experiment: str, rerun_resumes: bool) -> str:
    """How a person continues ``experiment``. ``hpckit resume`` always does; the same command
    again only when it names the same experiment (``rerun_resumes``): a name that hpckit made
    from the time is a new one at every run."""
    if rerun_resumes:
        return f"run the same command again, or: hpckit resume {experiment}"
    name = posixpath.basename(experiment.split("?", 1)[0].rstrip("/"))
    return (f"run: hpckit resume {experiment} (or the script with RunConfig(name={name!r}); "
            "the same command alone starts a new experiment, its name being made from the time)")


class CriterionMet(BaseException):
    """Raised by report() on every rank after the report that met ``RunConfig(stop=...)``;
    the attempt then ends as if the training function had returned."""


def criterion_met(stop: Any, name: str, metrics: dict[str, Any], iteration: int) -> bool:
    """Whether ``RunConfig(stop=...)`` says the run is done after report number
    ``iteration`` (1 for the first) with these metrics (rank 0's); a function gets them with
    ``training_iteration``, as Ray's stoppers get a result."""
    if stop is None:
        return False
    reached = {**metrics, "training_iteration": iteration}
    if callable(stop):
        return bool(stop(name, reached))
    return any((value := score_of(reached, key)) is not None and value >= threshold
               for key, threshold in stop.items())
