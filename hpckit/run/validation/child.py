"""One validation process: the payload it reads, the environment it runs in, and how it
ended (metrics, an error, or too long).

A validation as a Slurm job of its own (``ValidationConfig(sbatch={...})``): rank 0 runs
``sbatch --wait``, which ends when the job does; the job runs the same validation process
as on rank 0's node, on whatever node Slurm gives it, and answers in the same folder, which
is on the experiment's shared filesystem.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from hpckit import settings
from hpckit.checkpoint import Checkpoint
from hpckit.config import ValidationConfig
from hpckit.experiment.manifest import FAILED, TIMED_OUT, VALIDATED, Validation
from hpckit.processes import ended_with
from hpckit.run.job import write_payload

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


FN, TASK, RESULT, ERROR = "validation_fn.pkl", "task.pkl", "result.json", "error.txt"
# A rank's launcher and Slurm step: the validation process is neither a rank nor a task.
NOT_INHERITED = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCALRANK", "HYDRA_", "I_MPI_", "MPIR_",
                 "SLURM_STEP", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "HPCKIT_WORKER")


def made_payload(payload_dir: str | None, config: ValidationConfig) -> str:
    """A new folder in ``payload_dir`` (None: the temporary directory) that the validation
    processes read the function from, and answer in."""
    for _ in range(10):
        try:
            if payload_dir is not None:
                os.makedirs(payload_dir, exist_ok=True)
            payload = tempfile.mkdtemp(prefix="hpckit-validate-", dir=payload_dir)
            break
        except FileNotFoundError:  # a rank removed the empty staging folder in between
            continue
    else:
        raise FileNotFoundError(f"could not make a folder in {payload_dir} for the validations")
    write_function(payload, config)
    return payload


def remove_payload(payload: str, config: ValidationConfig) -> None:
    """The payload, and for Slurm jobs the staging folders it was made in, where empty."""
    shutil.rmtree(payload, ignore_errors=True)
    if config.sbatch is not None:
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(payload))
            os.rmdir(os.path.dirname(os.path.dirname(payload)))


def write_function(payload: str, config: ValidationConfig) -> None:
    """The validation function and how to import the user's script, once per attempt."""
    write_payload(payload, config.fn, FN, "ValidationConfig(fn=...)",
                  f"define {getattr(config.fn, '__qualname__', config.fn)} at module level "
                  "(not a lambda or a nested function)")


def environment(threads: int) -> dict[str, str]:
    """This process's environment, less the launcher's, with ``threads`` CPU threads and the
    GPUs the rank was started with (not the one device hpckit narrowed the rank to)."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(NOT_INHERITED)}
    started = settings.current().cuda_visible_devices
    if started is not None:
        kept["CUDA_VISIBLE_DEVICES"] = started
    elif kept.get("CUDA_VISIBLE_DEVICES"):  # narrowed from unset; an empty one hides them all
        del kept["CUDA_VISIBLE_DEVICES"]
    return {**kept, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "HPCKIT_EARLY_STOP": "0"}


Running = subprocess.Popen[bytes] | SlurmJob


def start(payload: str, checkpoint: Checkpoint, validation: Validation,
          config: ValidationConfig) -> tuple[Running, str]:
    """Start validating ``checkpoint``, on this node or as a Slurm job as ``config`` says;
    the process and the folder it answers in."""
    work = tempfile.mkdtemp(prefix="validation-", dir=payload)
    with open(os.path.join(work, TASK), "wb") as f:
        pickle.dump((checkpoint, validation.fn_kwargs), f)
    env = environment(config.threads)
    if config.sbatch is not None:
        return submit(payload, work, env, config.threads, config.sbatch,
                            validation.timeout_s, (RESULT, ERROR)), work
    process = subprocess.Popen(
        [sys.executable, "-m", "hpckit.launch.validator", payload, work],
        env=env, stdin=subprocess.DEVNULL, preexec_fn=ended_with(os.getpid(), signal.SIGKILL))
    return process, work


class Local:
    """One validation on this node, or in a Slurm job that this node waits for."""

    def __init__(self, payload: str, checkpoint: Checkpoint, validation: Validation,
                 config: ValidationConfig) -> None:
        self.validation = validation
        self.process, self.work = start(payload, checkpoint, validation, config)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def outcome(self) -> Validation:
        return outcome(self.process, self.work, self.validation)

    def kill(self) -> None:
        if self.running:
            self.process.kill()

    def close(self) -> None:
        """After its outcome (or a kill): the process ended, its answer folder removed."""
        self.kill()
        if isinstance(self.process, subprocess.Popen):
            self.process.wait()
        shutil.rmtree(self.work, ignore_errors=True)


def outcome(process: Running, work: str, validation: Validation) -> Validation:
    """Wait for the process (killed after ``timeout_s``) and say how it ended."""
    try:
        code = process.wait(timeout=validation.timeout_s)
    except subprocess.TimeoutExpired:
        return timed_out(process, validation)
    if code == 0 and os.path.exists(os.path.join(work, RESULT)):
        with open(os.path.join(work, RESULT)) as f:
            metrics: dict[str, Any] = json.load(f)
        return validation.ended(VALIDATED, metrics=metrics)
    return validation.ended(FAILED, error=_error(work, code))


def timed_out(process: Running, validation: Validation) -> Validation:
    """Stop a validation that outlived its ``timeout_s``."""
    process.kill()
    process.wait()
    return validation.ended(TIMED_OUT, error=f"took longer than timeout_s="
                            f"{validation.timeout_s:g}; stopped")


def _error(work: str, code: int) -> str:
    try:
        with open(os.path.join(work, ERROR)) as f:
            return f.read().strip() or f"exited with status {code}"
    except OSError:
        ended = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        said = submission_error(work)
        return f"{ended}: {said}" if said else f"{ended} before saying why"
