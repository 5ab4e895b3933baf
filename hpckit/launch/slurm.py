"""Slurm: the sbatch script that `hpckit resume --sbatch` writes (requeueing is rank-side, in
:mod:`hpckit.run.stop`)."""

from __future__ import annotations

import shlex


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
{exports}srun --mpi=pmi2 --kill-on-bad-exit=1 {command}
"""
