"""A sweep under mpirun/srun: the world split into groups of a trial's ranks, each group's
leader taking trials from the queue on rank 0 until none is left, its trials' reports
decided there. Every rank returns the sweep manifest as rank 0's controller left it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hpckit import exits, logs
from hpckit import settings as _settings
from hpckit.logs import log
from hpckit.run.ending.exit import interrupted, register_pid, requeued_now
from hpckit.run.mpi import progress
from hpckit.run.mpi.waiting import from_root, wait_for_all
from hpckit.sweep.decisions import Messages, serving
from hpckit.sweep.record import SweepManifest, Trial
from hpckit.sweep.trialqueue import TrialQueue, split

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
