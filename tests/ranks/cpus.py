"""Prints the CPUs this process may run on, as a rank of a job step is given them:
``CPUS <rank> <cpu>,<cpu>...`` (the rank from the launcher's PMI, or srun's)."""

from __future__ import annotations

import os

rank = os.environ.get("PMI_RANK") or os.environ.get("SLURM_PROCID") or "?"
line = f"CPUS {rank} {','.join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))}\n"
os.write(1, line.encode())  # one write: the ranks share the job's output file
