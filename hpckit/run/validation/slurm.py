"""A validation as a Slurm job of its own (``ValidationConfig(sbatch={...})``): rank 0 runs
``sbatch --wait``, which ends when the job does; the job runs the same validation process
as on rank 0's node, on whatever node Slurm gives it, and answers in the same folder, which
is on the experiment's shared filesystem."""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
import sys
import time

from hpckit.processes import ended_with

SUBMIT_ERRORS = "sbatch.err"
OUTPUT = "slurm.out"
QUEUE_POLL_S = 0.2
# The training job's own: a job submitted from inside it must not take them as its own.
JOB_ENVIRONMENT = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
KEPT = ("SLURM_CONF",)


class SlurmJob:
    """``sbatch --wait``, seen as the validation process: ``wait``, ``poll``, and ``kill``,
    which cancels the job, not only the waiting ``sbatch``. The job has ended for us once it
    answered (``answers``: success's file, then failure's): ``sbatch --wait`` learns of a
    job's end only at its next look, seconds later."""

    def __init__(self, submitter: subprocess.Popen[bytes], job_id: str | None, work: str,
                 answers: tuple[str, str]) -> None:
        self.submitter = submitter
        self.job_id = job_id
        self.work = work
        self.answers = answers

    def wait(self, timeout: float | None = None) -> int:
        """The job's status; ``timeout`` counts from the job's start, not its time in the
        queue, which on a busy cluster says nothing about the validation."""
        began: float | None = None
        while (code := self.poll()) is None:
            if began is None and self.started:
                began = time.monotonic()
            if timeout is not None and began is not None and time.monotonic() - began > timeout:
                raise subprocess.TimeoutExpired(f"Slurm job {self.job_id}", timeout)
            time.sleep(QUEUE_POLL_S)
        return code

    def poll(self) -> int | None:
        for code, name in enumerate(self.answers):
            if os.path.exists(os.path.join(self.work, name)):
                return code
        return self.submitter.poll()

    @property
    def started(self) -> bool:
        """Slurm makes the job's output file as the job starts."""
        return os.path.exists(os.path.join(self.work, OUTPUT))

    def kill(self) -> None:
        """Cancel the job, unless it has answered (it then ends by itself), and stop waiting."""
        if self.poll() is None and self.job_id is not None:
            subprocess.run(["scancel", self.job_id], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=60, check=False)
        self.submitter.kill()
        self.submitter.wait()


def submit(payload: str, work: str, env: dict[str, str], threads: int,
           options: dict[str, str | int], timeout_s: float | None,
           answers: tuple[str, str]) -> SlurmJob:
    """Submit the validation that waits in ``work`` and return once Slurm has taken it."""
    command = [sys.executable, "-m", "hpckit.launch.validator", payload, work]
    arguments: dict[str, str | int] = {
        "job-name": "hpckit-validation", **_time_limit(timeout_s), **options,
        "cpus-per-task": threads, "output": os.path.join(work, OUTPUT)}
    with open(os.path.join(work, SUBMIT_ERRORS), "wb") as errors:
        submitter = subprocess.Popen(
            ["sbatch", "--wait", "--parsable", *(f"--{k}={v}" for k, v in arguments.items()),
             "--wrap", "exec " + shlex.join(command)],
            env=_submission_environment(env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=errors,
            preexec_fn=ended_with(os.getpid(), signal.SIGKILL))
    with submitter.stdout or open(os.devnull, "rb") as said:
        answer = said.readline().decode().strip()  # the job id, once submitted
    return SlurmJob(submitter, answer.split(";")[0] or None, work, answers)


def _time_limit(timeout_s: float | None) -> dict[str, str]:
    """A job that outlives its waiter (rank 0 killed) still ends soon after ``timeout_s``."""
    return {} if timeout_s is None else {"time": str(math.ceil(timeout_s / 60) + 1)}


def _submission_environment(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in KEPT or not k.startswith(JOB_ENVIRONMENT)}


def submission_error(work: str) -> str | None:
    """What sbatch said when it could not submit, or the job's last line of output."""
    for name in (SUBMIT_ERRORS, OUTPUT):
        try:
            with open(os.path.join(work, name), errors="replace") as f:
                lines = [line.strip() for line in f if line.strip()]
        except OSError:
            continue
        if lines:
            return lines[-1]
    return None
