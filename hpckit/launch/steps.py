"""Where each attempt's ranks start: on this node under mpiexec, or, in a Slurm allocation,
as a job step across its nodes with the lost ones left out (:mod:`hpckit.launch.allocation`).

A lost node is told while the step runs, not by Slurm marking it DOWN: a node that stopped
beating (:mod:`hpckit.launch.heartbeat`) is asked (:func:`~hpckit.launch.lost.lost_nodes`),
and a step that waits for a lost one is given up and cancelled. A rank's exception, or its
kill by the out-of-memory killer, ends the step by itself and leaves its node in the run:
only a node whose slurmd is gone is left out.
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Callable, Collection

from hpckit.errors import NoSpareNode
from hpckit.launch import heartbeat, lost
from hpckit.launch.allocation import Allocation, current, srun_command
from hpckit.launch.process import Launch, mpiexec
from hpckit.logs import log
from hpckit.run.ending import stop
from hpckit.run.ending.retry import RetryPolicy, recurring
from hpckit.run.mpi.library import srun_plugin
from hpckit.settings import Settings


class Steps:
    """The launch of each attempt on this node: mpiexec, the same every time."""

    launcher = "mpiexec"
    allocation: Allocation | None = None
    lost: frozenset[str] = frozenset()  # nodes left out
    growing = False  # the step was given up on to start again on more ranks

    def __init__(self, settings: Settings, ranks: int, program: list[str]) -> None:
        self.ranks = ranks
        self._launch = mpiexec(settings, ranks, program)

    def launch(self) -> Launch:
        """The command that starts this attempt's ranks."""
        return self._launch

    def next_ranks(self) -> int:
        """How many ranks the next :meth:`launch` starts."""
        return self.ranks

    def watch(self, alive: str) -> Callable[[], bool] | None:
        """For run_process: whether to give up on a step that waits for a lost node, given
        the folder where the nodes beat (None: nothing to watch)."""
        return None

    def after_failure(self) -> bool:
        """A step failed: whether the next attempt has the nodes it needs."""
        return True

    def cancel(self) -> None:
        """End the tasks of a step given up on."""

    def no_spare(self, experiment: str | None = None, named: bool = False) -> str:
        return ""


class AllocationSteps(Steps):
    """Each attempt a job step across the Slurm allocation, without the nodes that were lost."""

    launcher = "srun"

    def __init__(self, settings: Settings, ranks: int, program: list[str],
                 allocation: Allocation) -> None:
        self.ranks = ranks
        self.allocation: Allocation = allocation
        self.lost = frozenset()
        self.returned: frozenset[str] = frozenset()  # lost, then back
        self.nodes: tuple[str, ...] = ()
        self.name = f"hpckit-{uuid.uuid4().hex[:12]}"
        self._program = program
        self._mpi = srun_plugin()

    def launch(self) -> Launch:
        nodes = self.allocation.step_nodes(self.ranks, self.lost)
        if nodes is None:
            raise NoSpareNode(self.no_spare())
        self.nodes = nodes
        command = srun_command(self.allocation, nodes, self.ranks, self._mpi, self.name,
                               self._program, overlap=bool(self.lost or self.returned))
        return Launch(command, signals_tasks=True)

    def watch(self, alive: str) -> Callable[[], bool] | None:
        asked: set[str] = set()
        looked = [0.0]

        def gone() -> bool:
            if time.monotonic() - looked[0] < heartbeat.BEAT_S:
                return False
            looked[0] = time.monotonic()
            suspects = tuple(n for n in heartbeat.stale(alive, self.nodes) if n not in asked)
            asked.update(suspects)  # a node that answered is not asked again in this step
            return bool(suspects) and self._find_lost(suspects)
        return gone

    def after_failure(self) -> bool:
        """Leave out the step's nodes that are gone, so that the next :meth:`launch` uses
        spares instead; whether enough nodes are left."""
        self._find_lost(self.nodes)
        return self.allocation.step_nodes(self.next_ranks(), self.lost) is not None

    def cancel(self) -> None:
        lost.cancel_step(self.allocation.job_id, self.name)

    def _find_lost(self, nodes: tuple[str, ...]) -> bool:
        found = lost.lost_nodes(tuple(n for n in nodes if n not in self.lost))
        if found:
            self.lost |= found
            log.warning("node(s) %s of Slurm job %s lost (their slurmd does not answer); "
                        "leaving them out", ",".join(sorted(found)), self.allocation.job_id)
        return bool(found)

    @property
    def fewest(self) -> int:
        """The fewest ranks the run can go on with."""
        return self.ranks

    def no_spare(self, experiment: str | None = None, named: bool = False) -> str:
        """What the run says when too few nodes are left; ``named``: the experiment's name
        is the user's (``RunConfig(name=...)``, ``$HPCKIT_NAME``), not the default that
        holds the job id."""
        allocation = self.allocation
        alive = len(allocation.nodes) - len(self.lost)
        return (f"node(s) {','.join(sorted(self.lost))} of Slurm job {allocation.job_id} "
                f"lost, and no spare node is left: the run needs "
                f"{allocation.needed(self.fewest)} node(s) for {self.fewest} rank(s), "
                f"{alive} answer. Nothing committed is lost. To continue, "
                f"{how_to_continue(allocation.job_id, experiment, named)} Ask for a "
                "spare node next time (one more node than the ranks fill, with --no-kill). "
                "Per-rank shards need the same number of ranks; a run whose checkpoints are "
                "DCP can be resumed on fewer.")


class Next(enum.Enum):
    """What follows a failed attempt: one rule for every loop that starts ranks again
    (``python train.py``'s launcher, ``hpckit run`` and ``hpckit resume``)."""

    RESTART = "restart"  # on the same nodes, or with spares for the lost ones
    SPENT = "spent"  # FailureConfig(max_failures) is spent: the run ends failed
    NO_SPARE = "no spare"  # too few nodes are left: the job is requeued where it allows it


def after_failure(steps: Steps, policy: RetryPolicy, failed_attempt: int,
                  errors: Collection[BaseException] = ()) -> Next:
    """After the attempt numbered ``failed_attempt`` failed (with ``errors``, each failed
    rank's, where known)."""
    if not policy.allows(failed_attempt, errors):
        if why := recurring(errors):
            log.error("%s", why)
        return Next.SPENT
    return Next.RESTART if steps.after_failure() else Next.NO_SPARE


def requeued_instead(said: str, settings: Settings) -> bool:
    """The run cannot go on in this job (no spare node, or none its checkpoint allows):
    ``said`` once, and whether Slurm requeued the job, which then resumes the run."""
    log.error("%s", said)
    return stop.requeue(settings)


def how_to_continue(job_id: str, experiment: str | None, named: bool) -> str:
    """How a job that cannot go on is continued: requeued, it keeps its id and so its
    experiment; a job submitted again resumes only an experiment the user named, since a
    default name holds the job id."""
    requeue = f"requeue the job (scontrol requeue {job_id}, where it allows requeues)"
    if named:
        return f"{requeue} or submit it again: it resumes from the last committed checkpoint."
    resume = f"hpckit resume {experiment or '<experiment>'} --sbatch resume.sbatch"
    return (f"{requeue}, or continue it in a new job with `{resume}` (a job submitted again "
            "would start a new experiment: the default name holds the job id; name it with "
            "RunConfig(name=...) or HPCKIT_NAME to make resubmitting resume).")


def warn_of_idle_spares(steps: Steps, policy: RetryPolicy, setting: str) -> None:
    """Once, as a run starts in an allocation: spare nodes that no restart will use
    (:meth:`~hpckit.launch.allocation.Allocation.idle_spares`); ``setting`` names what sets
    ``policy``'s restarts."""
    said = steps.allocation and steps.allocation.idle_spares(steps.ranks, policy.max_failures,
                                                             setting)
    if said:
        log.warning("%s", said)


def steps_for(settings: Settings, ranks: int, program: list[str]) -> Steps:
    """Steps on this node, or across the Slurm allocation this process runs in."""
    allocation = current(settings)
    if allocation is None:
        return Steps(settings, ranks, program)
    return AllocationSteps(settings, ranks, program, allocation)
