"""Slurm: requeueing the current job, and the sbatch script for `hpckit resume --sbatch`."""

from __future__ import annotations

import shlex
import shutil
import subprocess

from hpckit._env import Environment
from hpckit._log import log


def job_to_requeue(env: Environment) -> str | None:
    """The id ``scontrol requeue`` needs: ``ARRAYJOB_TASK`` for an array task, else the job."""
    if env.slurm_array_job_id and env.slurm_array_task_id:
        return f"{env.slurm_array_job_id}_{env.slurm_array_task_id}"
    return env.slurm_job_id


def requeue(env: Environment) -> bool:
    """Ask Slurm to requeue this job; the requeued job resumes from the manifest."""
    job = job_to_requeue(env)
    scontrol = shutil.which("scontrol")
    if not job or not scontrol:
        return False
    out = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        log.error("scontrol requeue %s failed (%s); the job was submitted without --requeue? "
                  "Resume it by hand: hpckit resume EXPERIMENT", job, out.stderr.strip())
        return False
    log.info("requeued Slurm job %s; it resumes from the last committed checkpoint", job)
    return True


def render_sbatch(argv: list[str], ntasks: int, cwd: str, job_name: str, python: str,
                  environment: dict[str, str]) -> str:
    """The sbatch script that continues an experiment: a pure function of its inputs."""
    command = " ".join(shlex.quote(a) for a in [python, *argv])
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(environment.items()))
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --chdir={cwd}
#SBATCH --ntasks={ntasks}
#SBATCH --requeue
#SBATCH --signal=USR2@120
#SBATCH --open-mode=append
#SBATCH --output={job_name}-%j.out
# Written by `hpckit resume --sbatch`: it continues the experiment from its manifest.
# USR2 two minutes before the time limit makes hpckit commit a checkpoint and requeue.
cd {shlex.quote(cwd)}
{exports}# A requeued job reuses its step ids, and MPICH its shared memory names: skip used ones.
for _ in $(seq "${{SLURM_RESTART_COUNT:-0}}"); do srun --ntasks=1 true; done
srun --mpi=pmi2 {command}
"""
