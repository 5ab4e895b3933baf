"""Slurm: the sbatch scripts that `hpckit resume --sbatch` and `hpckit sweep` write
(requeueing is rank-side, in :mod:`hpckit.run.ending.stop`)."""

from __future__ import annotations

import shlex

from hpckit.run.mpi.library import DEFAULT_SRUN_MPI

RESUME_NOTE = "# Written by `hpckit resume --sbatch`: it continues the experiment from its manifest."
SWEEP_NOTE = ("# Written by `hpckit sweep`: every array task runs the script, and its Tuner runs\n"
              "# that task's share of the trials. Submitting it again resumes the sweep.")


def render_sbatch(argv: list[str], ntasks: int, cwd: str, job_name: str, python: str,
                  environment: dict[str, str], array: int | None = None,
                  directives: tuple[str, ...] = (), srun_mpi: str = DEFAULT_SRUN_MPI) -> str:
    """The sbatch script that continues an experiment or, with ``array`` tasks, runs a sweep
    over a job array: a pure function of its inputs. ``directives`` are more ``--key=value``
    options for ``#SBATCH`` lines, e.g. ``("--time=02:00:00", "--partition=gpu")``;
    ``srun_mpi`` is the plugin the ranks' MPI speaks (:func:`~hpckit.run.mpi.library.srun_plugin`)."""
    command = " ".join(shlex.quote(a) for a in [python, *argv])
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(environment.items()))
    extra = [f"--array=0-{array - 1}"] if array is not None else []
    output = f"{job_name}-%A_%a.out" if array is not None else f"{job_name}-%j.out"
    lines = "".join(f"#SBATCH {d}\n" for d in [*extra, *directives])
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --chdir={cwd}
#SBATCH --ntasks={ntasks}
{lines}#SBATCH --requeue
#SBATCH --signal=B:USR2@120
#SBATCH --open-mode=append
#SBATCH --output={output}
trap 'warned=1' USR2
{RESUME_NOTE if array is None else SWEEP_NOTE}
# USR2 two minutes before the time limit makes hpckit commit a checkpoint and requeue.
cd {shlex.quote(cwd)}
{exports}{warned_step(f"srun --mpi={srun_mpi} --kill-on-bad-exit=1 {command}")}
"""


WARNED_STEP = """\
# Slurm warns this script (--signal=B:USR2@120), which passes the warning to the ranks once
# they have run HOLD seconds: a warning that comes as the job starts then stops the run at a
# report instead of killing ranks still starting. srun hands USR2 to every rank.
HOLD=10
{srun} &
step=$! started=$SECONDS
warn_ranks() {{ sleep $(( started + HOLD > SECONDS ? started + HOLD - SECONDS : 0 )); \\
  kill -USR2 "$step" 2>/dev/null || true; }}
trap warn_ranks USR2
if [ -n "${{warned:-}}" ]; then warn_ranks; fi
status=0
while :; do  # a warning interrupts wait: wait again until srun has ended
  wait "$step" && status=0 || status=$?
  kill -0 "$step" 2>/dev/null || break
done
exit "$status\""""


def warned_step(srun: str) -> str:
    """``srun`` in the background, with Slurm's warning to the script passed on to its ranks
    (as at the end of ``slurm/requeue.sbatch``)."""
    return WARNED_STEP.format(srun=srun)
