"""Packing trials into one job: the launched world split into groups of a trial's ranks, and
a queue on world rank 0 from which each group's leader takes the next trial, as the sweep's
controller (:mod:`hpckit.sweep.controller`) chooses it, and through which its trial's reports
are decided.

The queue is served by a thread of rank 0 on a communicator of its own (MPI is initialised
with MPI_THREAD_MULTIPLE), so a leader gets its next trial at once even while rank 0 trains
(one-sided MPI would wait for rank 0's next MPI call: up to a whole epoch).

A sweep under mpirun/srun: the world split into groups of a trial's ranks, each group's
leader taking trials from the queue on rank 0 until none is left, its trials' reports
decided there. Every rank returns the sweep manifest as rank 0's controller left it.

A sweep packed under ``python sweep.py``: hpckit starts ``TuneConfig(max_concurrent_trials)``
groups of a trial's ranks under mpiexec on this node, and each rank re-runs the script as a
trainer's spawned ranks do (:mod:`hpckit.launch.mainimport`), then packs the trials as under
mpirun (:mod:`hpckit.sweep.trialqueue`). This process waits, passes signals on, and reads the
sweep's results from its manifest when the ranks are done.

The ranks' entry point is :mod:`hpckit.sweep.worker`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from hpckit import exits, logs, uncaught
from hpckit import settings as _settings
from hpckit.errors import ConfigError, TrainingFailedError
from hpckit.launch.process import mpiexec, run_process, started_for
from hpckit.logs import log
from hpckit.run.ending import stop
from hpckit.run.ending.exit import interrupted, register_pid, requeued_now
from hpckit.run.job import write_payload
from hpckit.run.mpi import progress
from hpckit.run.mpi.waiting import from_root, receive_from, send_to, wait_for_all
from hpckit.settings import Settings, variable
from hpckit.sweep.controller import WAIT
from hpckit.sweep.decisions import DECISION, RESULT, STOP, Messages, serving
from hpckit.sweep.record import SweepManifest, Trial

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

    from hpckit.sweep.controller import Assignment, TuneController
    from hpckit.sweep.record import Trial

ASK, ANSWER = 71, 72
POLL_S = 0.01
WAIT_S = 0.05  # a leader told to wait asks again after this


@dataclass(frozen=True)
class Groups:
    """This rank's group: its communicator, its number, and how many groups take trials."""

    comm: Comm
    number: int
    active: int

    @property
    def leader(self) -> bool:
        return bool(self.comm.rank == 0)

    @property
    def takes_trials(self) -> bool:
        return self.number < self.active


def check(size: int, per_trial: int) -> None:
    """Before anything starts: ``size`` launched ranks split into trials of ``per_trial``."""
    if size % per_trial:
        fits = per_trial * max(1, size // per_trial)
        raise ConfigError(
            f"{size} ranks cannot be split into trials of {per_trial} rank(s): launch a "
            f"multiple of {per_trial} (e.g. mpirun -n {fits}), or give each trial a number of "
            f"ranks that divides {size}.")


def split(world: Comm, per_trial: int, max_concurrent: int | None) -> Groups:
    """Groups of ``per_trial`` consecutive ranks (a node's ranks stay together where the
    launcher placed them so); at most ``max_concurrent`` of them take trials."""
    check(world.size, per_trial)
    number = world.rank // per_trial
    groups = world.size // per_trial
    return Groups(world.Split(number, world.rank), number, min(groups, max_concurrent or groups))


class TrialQueue:
    """Hands each group's leader its next trial from the sweep's controller on world rank 0,
    and answers the reports of the trials they run (:class:`hpckit.sweep.decisions.Messages`).
    A leader's request carries how its previous trial ended. Collective: every rank of
    ``world`` makes it and closes it."""

    def __init__(self, world: Comm, controller: TuneController | None, leaders: int) -> None:
        self.comm = world.Dup()
        self._controller = controller  # on rank 0 only
        self._abandoned = threading.Event()
        self._server: threading.Thread | None = None
        self.failure: BaseException | None = None
        if self.comm.rank == 0:
            self._server = threading.Thread(target=self._serve, args=(leaders,),
                                            name="hpckit-trial-queue", daemon=True)
            self._server.start()

    def take(self, ended: Trial | None) -> Assignment | None:
        """The next trial for this rank's group (its leader asks), after telling how its
        previous one ``ended``; None when the sweep has nothing left for it."""
        while True:
            if self.comm.rank == 0:
                answer = self._answer(ended)
            else:
                send_to(self.comm, ended, 0, ASK)
                answer = receive_from(self.comm, 0, ANSWER)
            ended = None
            if answer != WAIT:
                return cast("Assignment | None", answer)
            time.sleep(WAIT_S)

    def close(self) -> None:
        if self._server is not None:
            self._server.join()
        progress.free(self.comm)
        if self.failure is not None:
            raise self.failure

    def abandon(self) -> None:
        """The sweep ends early here (a stop signal, Ctrl-C, an error): the server thread
        stops before the process exits, or it would call MPI while MPI finalizes."""
        self._abandoned.set()
        if self._server is not None:
            self._server.join()

    def _answer(self, ended: Trial | None) -> Assignment | str | None:
        if self.failure is not None or self._controller is None:
            return None
        try:
            if ended is not None:
                self._controller.on_ended(ended)
            return self._controller.next_trial()
        except Exception as exc:  # the sweep's decisions failed: every group stops taking
            self.failure = exc
            return None

    def _decide(self, asked: tuple[int, dict[str, Any], bool]) -> str:
        if self.failure is not None or self._controller is None:
            return STOP
        try:
            return self._controller.on_result(*asked)
        except Exception as exc:
            self.failure = exc
            return STOP

    def _serve(self, leaders: int) -> None:
        """Answer the other leaders until each has been told that nothing is left."""
        from mpi4py import MPI

        remote = leaders - 1  # rank 0 leads a group and takes its trials directly
        status = MPI.Status()
        while remote > 0 and not self._abandoned.is_set():
            if not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
                time.sleep(POLL_S)
                continue
            asker, tag = status.Get_source(), status.Get_tag()
            if tag == RESULT:
                send_to(self.comm, self._decide(receive_from(self.comm, asker, RESULT)), asker,
                        DECISION)
                continue
            answer = self._answer(receive_from(self.comm, asker, ASK))
            send_to(self.comm, answer, asker, ANSWER)
            remote -= answer is None


if TYPE_CHECKING:
    from mpi4py.MPI import Comm

    from hpckit.sweep.controller import Assignment, TuneController


def run_packed(world: Comm, per_trial: int, max_concurrent: int | None,
               controller: TuneController | None,
               run_one: Callable[[Assignment, Comm], Trial]) -> SweepManifest:
    """Run the trials the controller (on world rank 0) hands out; every rank gets the sweep
    manifest as they ended."""
    wait_for_all(world)  # every rank has come: none busy-polls in the Split below
    groups = split(world, per_trial, max_concurrent)
    logs.configure(groups.comm.rank)  # each group's rank 0 logs its own trials' lines
    register_pid(_settings.current())  # idle ranks too get the Ctrl-C that python passes on
    meeting = world.Dup()  # where all ranks meet after Ctrl-C, whichever trial they were in
    if world.rank == 0:
        log.info("%d group(s) of %d rank(s) take the trials", groups.active, per_trial)
    queue = TrialQueue(world, controller if world.rank == 0 else None, groups.active)
    ended: Trial | None = None
    try:
        with serving(Messages(queue.comm, controller if world.rank == 0 else None)):
            while groups.takes_trials:
                assignment = queue.take(ended) if groups.leader else None
                assignment = from_root(groups.comm, assignment)
                if assignment is None:
                    break
                ended = run_one(assignment, groups.comm)
        wait_for_all(world)  # the others may run their last trial for a long while yet
    except BaseException as exc:
        queue.abandon()
        if isinstance(exc, SystemExit) and exc.code == exits.STOPPED:
            requeued_now()
        if isinstance(exc, KeyboardInterrupt):
            interrupted(exc, meeting)
        raise
    queue.close()
    manifest: SweepManifest = from_root(world, controller.manifest if controller else None)
    progress.free(groups.comm)
    progress.free(meeting)
    return manifest


TUNER = "tuner.pkl"


def run_spawned(tuner: Any, ranks: int, settings: Settings) -> None:
    """Run ``tuner.fit()`` on ``ranks`` ranks that hpckit starts; returns when they finished
    the sweep, raises as the ranks ended otherwise."""
    launch = mpiexec(settings, ranks, [sys.executable, "-m", "hpckit.sweep.worker"])
    payload = tempfile.mkdtemp(prefix="hpckit-sweep-", dir=settings.local_dir)
    try:
        write_payload(payload, tuner, TUNER, "the Tuner",
                      "define the training function at module level (not a lambda or a "
                      "nested function) and keep param_space picklable")
        log.info("starting %d rank(s) for the sweep's trials", ranks)
        code = run_process(launch, {variable("sweep_payload"): payload,
                                     variable("progress"): "0",  # this process shows it
                                     variable("started_at"): started_for(0, settings)}, settings)
    except KeyboardInterrupt:
        code = exits.INTERRUPTED
    finally:
        shutil.rmtree(payload, ignore_errors=True)
    if code == exits.INTERRUPTED:
        log.warning("sweep interrupted; finished trials are kept and interrupted ones resume "
                    "from their latest checkpoints. To go on, run the same command again.")
        stop.interrupt_handled()
        raise uncaught.shown_elsewhere(KeyboardInterrupt())
    if code == exits.STOPPED:
        raise SystemExit(exits.STOPPED)
    if code != 0:
        raise TrainingFailedError(
            f"the sweep's ranks exited with status {code} (a rank was killed, or failed alone; "
            "see the output above). Run the same command again: the sweep resumes.")
