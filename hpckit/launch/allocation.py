"""A Slurm allocation that ``python train.py`` or ``hpckit run`` was started in (a batch
script, or ``salloc``) without ``srun``: its nodes, and the job steps that put the ranks on
them. The ranks are started with ``srun`` across the allocation, as Slurm lays out the tasks,
and never all on the batch node, each with the job's ``--cpus-per-task``: since Slurm 22.05
srun no longer inherits it from sbatch or salloc, and where Slurm binds tasks to cores a rank
would otherwise get one CPU.

A run needs as many nodes as its ranks fill (``--ntasks-per-node``, else the allocation's
own tasks per node); the allocation's other nodes are spares. After a failed step the nodes
that were lost (:mod:`hpckit.launch.lost`) are left out, and spares take their place in the
order Slurm lists them.
"""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import dataclass

from hpckit.errors import LaunchError
from hpckit.settings import Settings

_COUNTS = re.compile(r"(\d+)(?:\(x(\d+)\))?")


@dataclass(frozen=True)
class Allocation:
    """The job's nodes in Slurm's order, how many tasks Slurm gives each, and the CPUs the
    job asked for each task (``--cpus-per-task``; None: Slurm's default, one)."""

    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: int
    cpus_per_task: int | None = None

    def __post_init__(self) -> None:
        if not self.nodes:
            raise LaunchError(f"Slurm job {self.job_id} lists no nodes (SLURM_JOB_NODELIST).")
        if self.tasks_per_node < 1:
            raise LaunchError(f"Slurm job {self.job_id}: tasks per node must be at least 1, "
                              f"not {self.tasks_per_node}.")

    def needed(self, ranks: int) -> int:
        """How many nodes ``ranks`` ranks fill; never more than the allocation has."""
        return min(len(self.nodes), math.ceil(ranks / self.tasks_per_node))

    def spares(self, ranks: int) -> tuple[str, ...]:
        """The nodes that a first step of ``ranks`` ranks leaves free."""
        return self.nodes[self.needed(ranks):]

    def idle_spares(self, ranks: int, max_failures: int, setting: str) -> str | None:
        """What to say where spare nodes will never be used: a run of ``ranks`` ranks that
        restarts nothing after a failure (``setting``, such as ``FailureConfig(max_failures)``,
        is ``max_failures``, 0) ends when a node is lost, whatever spares the job has."""
        spares = self.spares(ranks)
        if max_failures != 0 or not spares:
            return None
        return (f"Slurm job {self.job_id} has {len(spares)} spare node(s) ({','.join(spares)}), "
                f"but {setting} is 0: a failure ends the run, and a lost node is never "
                f"replaced. Allow restarts ({setting} of 1 or more, e.g. 3) for a spare to take "
                "a lost node's place.")

    def step_nodes(self, ranks: int, lost: frozenset[str]) -> tuple[str, ...] | None:
        """The nodes of the next step: the first ones Slurm lists that are not lost, as many
        as the ranks need; None when too few are left."""
        alive = tuple(n for n in self.nodes if n not in lost)
        needed = self.needed(ranks)
        return alive[:needed] if len(alive) >= needed else None


def tasks_per_node(ntasks_per_node: str | None, tasks_per_node_list: str | None) -> int:
    """``--ntasks-per-node`` where the job asked for it, else the most tasks Slurm gave one
    node (``SLURM_TASKS_PER_NODE``, such as ``2(x3),1``), else 1."""
    if ntasks_per_node and ntasks_per_node.isdigit():
        return int(ntasks_per_node)
    counts = [int(m.group(1)) for m in _COUNTS.finditer(tasks_per_node_list or "")]
    return max(counts, default=1)


def current(settings: Settings) -> Allocation | None:
    """The allocation this process runs in, where it was started in one but not as a task
    of a job step (which would make it a rank already); else None."""
    if not settings.slurm_job_id or not settings.slurm_nodelist or settings.launcher:
        return None
    return Allocation(settings.slurm_job_id, hostnames(settings.slurm_nodelist),
                      tasks_per_node(settings.slurm_ntasks_per_node,
                                     settings.slurm_tasks_per_node),
                      settings.slurm_cpus_per_task)


def hostnames(nodelist: str) -> tuple[str, ...]:
    """A Slurm host list (``n[1-3],gpu07``) as node names, expanded by Slurm itself."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise LaunchError(f"cannot expand the Slurm node list {nodelist!r} with `scontrol show "
                          f"hostnames` ({exc}); is Slurm's scontrol on PATH?") from None
    return tuple(out.split())


def srun_command(allocation: Allocation, nodes: tuple[str, ...], ranks: int, mpi: str,
                 name: str, program: list[str], overlap: bool,
                 exact: bool = False) -> tuple[str, ...]:
    """The ``srun`` that starts ``ranks`` tasks of ``program`` on ``nodes`` as the step
    ``name``. ``overlap``: a step after a lost node, whose step Slurm may still count as
    running (and holding the CPUs) until it marks the node DOWN. ``exact``: the step takes
    only the CPUs its tasks ask for, so that other steps (a sweep's trials) share the node.
    Each task asks for the job's ``--cpus-per-task``, which srun does not inherit."""
    cpus = allocation.cpus_per_task
    return ("srun", f"--mpi={mpi}", f"--nodes={len(nodes)}", f"--ntasks={ranks}",
            *((f"--cpus-per-task={cpus}",) if cpus else ()),
            f"--nodelist={','.join(nodes)}", f"--jobid={allocation.job_id}",
            f"--job-name={name}", "--kill-on-bad-exit=1", *(("--overlap",) if overlap else ()),
            *(("--exact",) if exact else ()), *program)
