"""Every environment variable hpckit reads, read and converted here, once per entry point.

Ground layer: imports only :mod:`hpckit.errors` and :mod:`hpckit.variables` (what each kind
of value accepts). Nothing is read at import time, so importing
hpckit never fails whatever the environment holds; :func:`current` reads the table on first
use and raises one :class:`ConfigError` that names each bad variable and what it accepts.
Entry points (``fit()``, a hpckit rank, each ``hpckit`` command) :func:`refresh` it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hpckit.errors import ConfigError
from hpckit.variables import (
    DEFAULT_LOCK_STALE_SECONDS,
    DEFAULT_STARTUP_TIMEOUT,
    DEFAULT_STOP_SIGNAL,
    FaultPoint,
    count,
    directory,
    level,
    moment,
    parse_fault,
    parse_signal,
    seconds,
    switch,
    text,
)

# field -> (variable, conversion). Launchers: MPICH hydra and Slurm's PMI-2 set PMI_*; Open MPI
# sets OMPI_*; PMIx launchers set PMIX_RANK; srun sets SLURM_STEP_NUM_TASKS inside a job step.
TABLE: dict[str, tuple[str, Callable[[str], Any]]] = {
    "storage": ("HPCKIT_STORAGE", text),
    "name": ("HPCKIT_NAME", text),
    "resume": ("HPCKIT_RESUME", text),
    "resume_workers": ("HPCKIT_RESUME_WORKERS", count),
    "log_level": ("HPCKIT_LOG_LEVEL", level),
    "local_dir": ("HPCKIT_LOCAL_DIR", directory),
    "mpiexec": ("HPCKIT_MPIEXEC", text),
    "master_addr": ("HPCKIT_MASTER_ADDR", text),
    "worker": ("HPCKIT_WORKER", text),
    "heartbeat": ("HPCKIT_HEARTBEAT", text),
    "sweep_payload": ("HPCKIT_SWEEP_PAYLOAD", text),
    "sweep_trial": ("HPCKIT_SWEEP_TRIAL", count),
    "pid_dir": ("HPCKIT_PID_DIR", text),
    "attempt": ("HPCKIT_ATTEMPT", count),
    "started_at": ("HPCKIT_STARTED_AT", moment),
    "restarts": ("HPCKIT_RESTARTS", switch),
    "previous_failure": ("HPCKIT_PREVIOUS_FAILURE", text),
    "previous_pids": ("HPCKIT_PREVIOUS_PIDS", text),
    "previous_hung": ("HPCKIT_PREVIOUS_HUNG", switch),
    "stop_signal": ("HPCKIT_STOP_SIGNAL", parse_signal),
    "fault": ("HPCKIT_FAULT", parse_fault),
    "tensorboard": ("HPCKIT_TENSORBOARD", switch),
    "progress": ("HPCKIT_PROGRESS", switch),
    "run_id": ("HPCKIT_RUN_ID", text),
    "lock_stale_seconds": ("HPCKIT_LOCK_STALE_SECONDS", seconds),
    "startup_timeout": ("HPCKIT_STARTUP_TIMEOUT", seconds),
    "inline_records": ("HPCKIT_INLINE_RECORDS", count),
    "ranks_per_node": ("HPCKIT_RANKS_PER_NODE", count),
    "pmi_size": ("PMI_SIZE", text),
    "ompi_size": ("OMPI_COMM_WORLD_SIZE", text),
    "pmix_rank": ("PMIX_RANK", text),
    "pmi_rank": ("PMI_RANK", text),
    "local_ranks": ("MPI_LOCALNRANKS", text),
    "srun_tasks": ("SLURM_STEP_NUM_TASKS", text),
    "slurm_job_id": ("SLURM_JOB_ID", text),
    "slurm_step_id": ("SLURM_STEP_ID", text),
    "slurm_procid": ("SLURM_PROCID", text),
    "slurm_gtids": ("SLURM_GTIDS", text),
    "slurm_array_job_id": ("SLURM_ARRAY_JOB_ID", text),
    "slurm_array_task_id": ("SLURM_ARRAY_TASK_ID", text),
    "slurm_array_task_count": ("SLURM_ARRAY_TASK_COUNT", text),
    "slurm_array_task_min": ("SLURM_ARRAY_TASK_MIN", text),
    "slurm_array_task_step": ("SLURM_ARRAY_TASK_STEP", text),
    "slurm_restart_count": ("SLURM_RESTART_COUNT", text),
    "slurm_nodelist": ("SLURM_JOB_NODELIST", text),
    "slurm_tasks_per_node": ("SLURM_TASKS_PER_NODE", text),
    "slurm_ntasks_per_node": ("SLURM_NTASKS_PER_NODE", text),
    "slurm_localid": ("SLURM_LOCALID", text),
    "slurm_cpus_per_task": ("SLURM_CPUS_PER_TASK", count),
    "cuda_visible_devices": ("CUDA_VISIBLE_DEVICES", text),
    "aws_endpoint": ("AWS_ENDPOINT_URL", text),  # the AWS SDK's: hpckit notes that one is set
    "aws_endpoint_s3": ("AWS_ENDPOINT_URL_S3", text),
}
_SLURM_FIELDS = ("slurm_job_id", "slurm_array_job_id", "slurm_array_task_id",
                 "slurm_restart_count", "slurm_nodelist", "slurm_tasks_per_node")


@dataclass(frozen=True)
class Settings:
    """The environment as hpckit uses it: typed values, defaults filled in."""

    storage: str | None = None
    name: str | None = None
    resume: str | None = None  # under hpckit resume: the training function it continues
    resume_workers: int | None = None  # under hpckit resume -n N: its world size
    log_level: str | None = None
    local_dir: str | None = None
    mpiexec: str | None = None
    master_addr: str | None = None
    worker: str | None = None
    heartbeat: str | None = None  # the folder a node's first rank beats into
    sweep_payload: str | None = None  # a sweep's ranks that python sweep.py started
    sweep_trial: int | None = None  # the one trial that a job step of a sweep runs
    pid_dir: str | None = None
    attempt: int = 0
    started_at: float | None = None  # when the user's command started (set for hpckit's ranks)
    restarts: bool = False  # the launching process restarts the ranks if they fail
    previous_failure: str | None = None  # how the launcher saw the ranks before these fail
    previous_pids: str | None = None  # theirs, comma-separated
    previous_hung: bool = False  # they were ended by the hang watchdog
    stop_signal: signal.Signals = DEFAULT_STOP_SIGNAL
    fault: FaultPoint | None = None
    tensorboard: bool = True
    progress: bool | None = None  # a sweep's live table; None: on a terminal only
    run_id: str | None = None
    lock_stale_seconds: float = DEFAULT_LOCK_STALE_SECONDS
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    inline_records: int = 1000  # a checkpoint with more files keeps their records apart
    ranks_per_node: int = 0  # tests: runs of this many ranks stand for nodes; 0: MPI says
    pmi_size: str | None = None
    ompi_size: str | None = None
    pmix_rank: str | None = None
    pmi_rank: str | None = None
    local_ranks: str | None = None
    srun_tasks: str | None = None
    slurm_job_id: str | None = None
    slurm_step_id: str | None = None
    slurm_procid: str | None = None
    slurm_gtids: str | None = None
    slurm_array_job_id: str | None = None
    slurm_array_task_id: str | None = None
    slurm_array_task_count: str | None = None
    slurm_array_task_min: str | None = None
    slurm_array_task_step: str | None = None
    slurm_restart_count: str | None = None
    slurm_nodelist: str | None = None
    slurm_tasks_per_node: str | None = None
    slurm_ntasks_per_node: str | None = None
    slurm_localid: str | None = None
    slurm_cpus_per_task: int | None = None
    cuda_visible_devices: str | None = None
    aws_endpoint: str | None = None
    aws_endpoint_s3: str | None = None

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Convert every variable of :data:`TABLE`; one error lists every bad one."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        problems = []
        for name, (variable, convert) in TABLE.items():
            raw = environ.get(variable) or None
            if raw is None:
                continue
            try:
                values[name] = convert(raw)
            except ValueError as exc:
                problems.append(f"{variable}={raw!r} is invalid: use {exc}.")
        if problems:
            raise ConfigError(" ".join(problems))
        return cls(**values)

    @property
    def array_share(self) -> tuple[int, int] | None:
        """(this task's position, the number of tasks) in a Slurm job array, else None."""
        values = (self.slurm_array_task_id, self.slurm_array_task_count,
                  self.slurm_array_task_min or "0", self.slurm_array_task_step or "1")
        if not all(v and v.isdigit() for v in values):
            return None
        task, count, low, step = (int(v) for v in values)  # type: ignore[arg-type]
        return (task - low) // max(step, 1), count

    @property
    def launcher(self) -> str | None:
        """Which external launcher started this process, if any."""
        if self.worker:
            return "hpckit"
        world = self.pmi_size or self.ompi_size  # set by mpiexec (Hydra, or Open MPI's)
        # mpiexec inside an allocation starts its proxies with srun (one task per node):
        # then mpiexec's world, not srun's task count, says who launched the ranks. Under
        # srun --mpi=pmix the ranks see PMIx (PMIX_RANK) and no mpiexec world.
        if self.srun_tasks and (not world or world == self.srun_tasks):
            return "srun"
        return "mpiexec" if world or self.pmix_rank else None

    @property
    def launched_tasks(self) -> int | None:
        """The number of ranks the launcher says it started, where it says so."""
        for value in (self.pmi_size, self.ompi_size, self.srun_tasks):
            if value and value.isdigit():
                return int(value)
        return None

    def slurm(self) -> dict[str, str]:
        """The Slurm job this process belongs to, for the manifest's attempt history."""
        return {k.removeprefix("slurm_"): getattr(self, k) for k in _SLURM_FIELDS if getattr(self, k)}

    @property
    def job_to_requeue(self) -> str | None:
        """The id ``scontrol requeue`` needs: ``ARRAYJOB_TASK`` for an array task, else the job."""
        if self.slurm_array_job_id and self.slurm_array_task_id:
            return f"{self.slurm_array_job_id}_{self.slurm_array_task_id}"
        return self.slurm_job_id

    @property
    def launched_rank(self) -> str:
        """This process's rank as its launcher numbered it, before MPI is up ("?" if unknown)."""
        return self.pmi_rank or self.pmix_rank or self.slurm_procid or "?"

    @property
    def lock_run_id(self) -> str | None:
        """What the attempts of one run share: hpckit's own run id, else the Slurm job."""
        if self.run_id:
            return self.run_id
        return f"slurm-{self.slurm_job_id}" if self.slurm_job_id else None


def variable(name: str) -> str:
    """The environment variable behind a :class:`Settings` field, for messages."""
    return TABLE[name][0]


_current: Settings | None = None


def current() -> Settings:
    """This process's settings, read on first use."""
    global _current
    if _current is None:
        _current = Settings.read()
    return _current


def refresh() -> Settings:
    """Read the environment again: an entry point's view of the variables it started with."""
    global _current
    _current = None
    return current()
