"""Every environment variable hpckit reads, through one table."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

# field -> variable. Launchers: MPICH hydra and Slurm's PMI-2 set PMI_*; Open MPI sets
# OMPI_*; PMIx launchers set PMIX_RANK; srun sets SLURM_STEP_NUM_TASKS inside a job step.
_VARIABLES = {
    "storage": "HPCKIT_STORAGE",
    "name": "HPCKIT_NAME",
    "log_level": "HPCKIT_LOG_LEVEL",
    "local_dir": "HPCKIT_LOCAL_DIR",
    "mpiexec": "HPCKIT_MPIEXEC",
    "master_addr": "HPCKIT_MASTER_ADDR",
    "worker": "HPCKIT_WORKER",
    "pid_dir": "HPCKIT_PID_DIR",
    "attempt": "HPCKIT_ATTEMPT",
    "stop_signal": "HPCKIT_STOP_SIGNAL",
    "fault": "HPCKIT_FAULT",
    "tensorboard": "HPCKIT_TENSORBOARD",
    "run_id": "HPCKIT_RUN_ID",
    "lock_stale_seconds": "HPCKIT_LOCK_STALE_SECONDS",
    "pmi_size": "PMI_SIZE",
    "ompi_size": "OMPI_COMM_WORLD_SIZE",
    "pmix_rank": "PMIX_RANK",
    "srun_tasks": "SLURM_STEP_NUM_TASKS",
    "slurm_job_id": "SLURM_JOB_ID",
    "slurm_array_job_id": "SLURM_ARRAY_JOB_ID",
    "slurm_array_task_id": "SLURM_ARRAY_TASK_ID",
    "slurm_restart_count": "SLURM_RESTART_COUNT",
    "slurm_nodelist": "SLURM_JOB_NODELIST",
    "slurm_tasks_per_node": "SLURM_TASKS_PER_NODE",
    "cuda_visible_devices": "CUDA_VISIBLE_DEVICES",
}


@dataclass(frozen=True)
class Environment:
    storage: str | None = None
    name: str | None = None
    log_level: str | None = None
    local_dir: str | None = None
    mpiexec: str | None = None
    master_addr: str | None = None
    worker: str | None = None
    pid_dir: str | None = None
    attempt: str | None = None
    stop_signal: str | None = None
    fault: str | None = None
    tensorboard: str | None = None
    run_id: str | None = None
    lock_stale_seconds: str | None = None
    pmi_size: str | None = None
    ompi_size: str | None = None
    pmix_rank: str | None = None
    srun_tasks: str | None = None
    slurm_job_id: str | None = None
    slurm_array_job_id: str | None = None
    slurm_array_task_id: str | None = None
    slurm_restart_count: str | None = None
    slurm_nodelist: str | None = None
    slurm_tasks_per_node: str | None = None
    cuda_visible_devices: str | None = None

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Environment:
        environ = os.environ if environ is None else environ
        return cls(**{f.name: environ.get(_VARIABLES[f.name]) or None for f in fields(cls)})

    @property
    def launcher(self) -> str | None:
        """Which external launcher started this process, if any."""
        if self.worker:
            return "hpckit"
        pmi = self.pmi_size or self.ompi_size or self.pmix_rank
        # mpiexec inside an allocation starts its proxies with srun (one task per node):
        # then PMI's world, not srun's task count, says who launched the ranks.
        if self.srun_tasks and (not pmi or self.pmi_size == self.srun_tasks):
            return "srun"
        return "mpiexec" if pmi else None

    @property
    def launched_tasks(self) -> int | None:
        """The number of ranks the launcher says it started, where it says so."""
        for value in (self.pmi_size, self.ompi_size, self.srun_tasks):
            if value and value.isdigit():
                return int(value)
        return None

    def slurm(self) -> dict[str, str]:
        """The Slurm job this process belongs to, for the manifest's attempt history."""
        keys = ("slurm_job_id", "slurm_array_job_id", "slurm_array_task_id",
                "slurm_restart_count", "slurm_nodelist", "slurm_tasks_per_node")
        return {k.removeprefix("slurm_"): getattr(self, k) for k in keys if getattr(self, k)}


def variable(field: str) -> str:
    """The environment variable behind an :class:`Environment` field, for messages."""
    return _VARIABLES[field]
