"""Slurm: the sbatch scripts that `hpckit resume --sbatch` and `hpckit sweep` write
(requeueing is rank-side, in :mod:`hpckit.run.ending.stop`)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from hpckit.run.mpi.library import DEFAULT_SRUN_MPI

RESUME_NOTE = "# Written by `hpckit resume --sbatch`: it continues the experiment from its manifest."
SWEEP_NOTE = ("# Written by `hpckit sweep`: every array task runs the script, and its Tuner runs\n"
              "# that task's share of the trials. Submitting it again resumes the sweep.")


def render_array_job(argv: list[str], ntasks: int, cwd: str, job_name: str, python: str,
                     array: int, directives: tuple[str, ...] = (),
                     srun_mpi: str = DEFAULT_SRUN_MPI) -> str:
    """The sbatch script of ``hpckit sweep``: ``array`` tasks of ``ntasks`` ranks, each running
    the script under srun; a pure function of its inputs. ``directives`` are more
    ``--key=value`` options for ``#SBATCH`` lines, e.g. ``("--time=02:00:00",)``;
    ``srun_mpi`` is the plugin the ranks' MPI speaks (:func:`~hpckit.run.mpi.library.srun_plugin`)."""
    command = " ".join(shlex.quote(a) for a in [python, *argv])
    lines = "".join(f"#SBATCH {d}\n" for d in [f"--array=0-{array - 1}", *directives])
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --chdir={cwd}
#SBATCH --ntasks={ntasks}
{lines}#SBATCH --requeue
#SBATCH --signal=B:USR2@120
#SBATCH --open-mode=append
#SBATCH --output={job_name}-%A_%a.out
trap 'warned=1' USR2
{SWEEP_NOTE}
# USR2 two minutes before the time limit makes hpckit commit a checkpoint and requeue.
cd {shlex.quote(cwd)}
{warned_step(f"srun --mpi={srun_mpi} --kill-on-bad-exit=1 {command}")}
"""


WARNED_STEP = """\
# Slurm warns this script (--signal=B:USR2@120), which passes the warning to the ranks once
# they have run HOLD seconds: a warning that comes as the job starts then stops the run at a
# report instead of killing ranks still starting. srun hands USR2 to every rank.
HOLD=10
{srun} &
step=$! started=$SECONDS
warn_ranks() {{  # once the ranks have run HOLD seconds, or at once where they have ended
  while (( SECONDS < started + HOLD )) && kill -0 "$step" 2>/dev/null; do sleep 1; done
  kill -USR2 "$step" 2>/dev/null || true
}}
trap warn_ranks USR2
if [ -n "${{warned:-}}" ]; then warn_ranks; fi
while kill -0 "$step" 2>/dev/null; do  # a warning interrupts wait: wait until srun ends
  wait "$step" || true
done
status=0  # srun's own, which bash keeps, also where it ended while a warning was handled
wait "$step" || status=$?
exit "$status\""""


def warned_step(srun: str) -> str:
    """``srun`` in the background, with Slurm's warning to the script passed on to its ranks
    (as at the end of ``slurm/requeue.sbatch``)."""
    return WARNED_STEP.format(srun=srun)


@dataclass(frozen=True)
class Layout:
    """How a job script asks for its ranks: ``--ntasks``, or as many nodes of as many ranks as
    the run's last allocation had (its spares included), kept when one of them fails."""

    ntasks: int
    nodes: int = 1
    per_node: int | None = None

    @classmethod
    def of(cls, ntasks: int, tasks_per_node: str | None, nodes: int) -> Layout:
        """``nodes`` (the last allocation's, spares included) of as many ranks as its job
        step had on a node (``SLURM_TASKS_PER_NODE``: ``4(x2)``, ``2,1``), where they hold
        ``ntasks`` ranks on two nodes or more; else ``--ntasks`` alone."""
        counts: list[int] = []
        for part in (tasks_per_node or "").split(","):
            found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
            if found is None:
                return cls(ntasks)
            counts += [int(found.group(1))] * int(found.group(2) or 1)
        if nodes < 2 or not counts or nodes * max(counts) < ntasks:
            return cls(ntasks)
        return cls(ntasks, nodes, max(counts))

    def directives(self) -> list[str]:
        if self.per_node is None:
            return [f"--ntasks={self.ntasks}"]
        return [f"--nodes={self.nodes}", f"--ntasks-per-node={self.per_node}", "--no-kill"]


def render_resume_job(experiment: str, layout: Layout, resume_options: list[str], cwd: str,
                      job_name: str, python: str, directives: tuple[str, ...] = ()) -> str:
    """The sbatch script of ``hpckit resume --sbatch``: slurm/multi-node.sbatch's form, in
    which ``hpckit resume`` itself is the batch process (``exec``). It starts the ranks with
    srun across the allocation, replaces a lost node by a spare, and takes Slurm's warning
    before the time limit to the ranks, which commit and requeue the job; each incarnation
    reads the manifest again."""
    lines = "".join(f"#SBATCH {d}\n" for d in [*layout.directives(), *directives])
    command = " ".join(shlex.quote(a) for a in [python, "-m", "hpckit", "resume", experiment,
                                                *resume_options])
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --chdir={cwd}
{lines}#SBATCH --requeue
#SBATCH --signal=B:USR2@120
#SBATCH --open-mode=append
#SBATCH --output={job_name}-%j.out
{RESUME_NOTE}
# hpckit resume is the batch process (exec): Slurm's warning two minutes before the time
# limit reaches it, and it passes it to the ranks, which commit a checkpoint and requeue.
export HPCKIT_STOP_SIGNAL=USR2
cd {shlex.quote(cwd)}
exec {command}
"""
