"""One validation process: the payload it reads, the environment it runs in, and how it
ended (metrics, an error, or too long)."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

from hpckit import settings
from hpckit.checkpoint import Checkpoint
from hpckit.config import ValidationConfig
from hpckit.experiment.validation import FAILED, TIMED_OUT, VALIDATED, Validation
from hpckit.processes import ended_with
from hpckit.run.job import write_payload
from hpckit.run.validation import slurm
from hpckit.run.validation.slurm import SlurmJob

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
        return slurm.submit(payload, work, env, config.threads, config.sbatch,
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
        said = slurm.submission_error(work)
        return f"{ended}: {said}" if said else f"{ended} before saying why"
