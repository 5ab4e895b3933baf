"""A sweep under mpirun/srun: the world split into groups of a trial's ranks, each group's
leader taking trials from the queue on rank 0 until none is left. Every rank returns the
trials that ended; rank 0 gathers them from the leaders."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hpckit import exits, logs
from hpckit import settings as _settings
from hpckit.logs import log
from hpckit.run.ending.exit import interrupted, register_pid, requeued_now
from hpckit.run.mpi import progress
from hpckit.run.mpi.waiting import from_root, gather_to_root, wait_for_all
from hpckit.sweep.record import Trial
from hpckit.sweep.trialqueue import TrialQueue, split

if TYPE_CHECKING:
    from mpi4py.MPI import Comm


def run_packed(world: Comm, per_trial: int, max_concurrent: int | None, pending: Sequence[int],
               run_one: Callable[[int, Comm], Trial]) -> list[Trial]:
    """Run the trials ``pending`` names; every rank gets every trial that ended (as
    ``run_one`` on a group's ranks returned it)."""
    groups = split(world, per_trial, max_concurrent)
    logs.configure(groups.comm.rank)  # each group's rank 0 logs its own trials' lines
    register_pid(_settings.current())  # idle ranks too get the Ctrl-C that python passes on
    meeting = world.Dup()  # where all ranks meet after Ctrl-C, whichever trial they were in
    if world.rank == 0:
        log.info("%d group(s) of %d rank(s) take the %d trial(s) to run", groups.active,
                 per_trial, len(pending))
    queue = TrialQueue(world, pending, groups.active)
    ended = []
    try:
        while groups.takes_trials:
            index = queue.take() if groups.leader else None
            index = from_root(groups.comm, index)
            if index is None:
                break
            ended.append(run_one(index, groups.comm))
        wait_for_all(world)  # the others may run their last trial for a long while yet
    except BaseException as exc:
        queue.abandon()
        if isinstance(exc, SystemExit) and exc.code == exits.STOPPED:
            requeued_now()
        if isinstance(exc, KeyboardInterrupt):
            interrupted(exc, meeting)
        raise
    queue.close()
    gathered = from_root(world, gather_to_root(world, ended if groups.leader else []))
    progress.free(groups.comm)
    progress.free(meeting)
    return sorted((trial for part in gathered for trial in part), key=lambda t: t.index)
