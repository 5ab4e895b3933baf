"""Rank 0's validations, in report order, in threads of their own: training never waits
for them, except at the end of a run that finished, which waits for the last. One runs at a
time on rank 0's node or in Slurm jobs (Ray's one in flight), one on each rank set aside."""

from __future__ import annotations

import os
import queue
import shutil
import threading
from concurrent.futures import Future
from concurrent.futures import wait as wait_for

from hpckit import faults
from hpckit.background import IDLE, Worker
from hpckit.checkpoint import Checkpoint, checkpoint_at
from hpckit.config import CheckpointConfig, ValidationConfig
from hpckit.errors import CommitError, ConfigError, ExperimentClosedError
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.manifest import STAGING_NAME, VALIDATED, CheckpointRecord, Validation
from hpckit.logs import log
from hpckit.run.job import TrainingJob
from hpckit.run.validation import child
from hpckit.run.validation.pool import Pool, Remote
from hpckit.settings import Settings


class Validator:
    """Validates the checkpoints it is given, and records how each validation ended."""

    def __init__(self, experiment: Experiment, config: ValidationConfig,
                 retention: CheckpointConfig, payload_dir: str | None,
                 pool: Pool | None = None) -> None:
        self.experiment = experiment
        self.config = config
        self.retention = retention
        self.pool = pool
        self.payload = child.made_payload(payload_dir, config)
        places: tuple[int | None, ...] = pool.ranks if pool else (None,)
        self._free: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        for place in places:
            self._free.put(place)
        # One thread a place; a validation takes the place that is free when it starts.
        self._worker = Worker("hpckit-validation", IDLE, threads=len(places))
        self._handed: list[Future[None]] = []
        self._running: dict[int | None, child.Local | Remote] = {}
        self._lock = threading.Lock()
        self._cancelled = False
        self.error: CommitError | None = None

    def resume(self) -> None:
        """The checkpoints an earlier attempt left awaiting validation (or validating when
        it died): validated first, each once."""
        waiting = self.experiment.manifest.awaiting_validation
        if waiting:
            log.info("validating %d checkpoint(s) that an earlier attempt left pending: %s",
                     len(waiting), ", ".join(r.directory for r in waiting))
        for record in waiting:
            self.submit(record.directory)

    def submit(self, directory: str) -> None:
        """Validate the committed checkpoint ``directory`` after those given before it."""
        with self._lock:
            self._handed = [f for f in self._handed if not f.done()]
            self._handed.append(self._worker.submit(self._one, directory))

    def finish(self) -> None:
        """At the end of a run that finished: wait until every validation has ended."""
        with self._lock:
            handed = [f for f in self._handed if not f.done()]
        if handed:
            log.info("waiting for %d validation(s) to end", len(handed))
        wait_for(handed)
        self._worker.stop()

    def cancel(self) -> None:
        """A run that stops or fails: the validations running are stopped and those queued
        are left pending in the manifest, for the resumed run to do."""
        with self._lock:
            self._cancelled = True
            running = list(self._running.values())
            handed = list(self._handed)
        for validation in running:
            validation.kill()
        self._worker.stop(wait=False, cancel=True)
        wait_for(handed, timeout=10)  # a validation that outlives it can write nothing
        child.remove_payload(self.payload, self.config)

    def _one(self, directory: str) -> None:
        """On a worker thread: validate ``directory`` at the place that is free."""
        place = self._free.get()
        try:
            self._validate(directory, place)
        except ExperimentClosedError:
            log.info("%s stays awaiting validation: its attempt ended first", directory)
        except Exception as exc:  # noqa: BLE001  (told at the next step, on every rank)
            self._failed(directory, exc)
        finally:
            with self._lock:
                self._running.pop(place, None)
            self._free.put(place)

    def _failed(self, directory: str, exc: Exception) -> None:
        """A validation whose outcome cannot be recorded: the run fails at its next step
        rather than leave the checkpoint awaiting validation, kept by retention, to the end."""
        log.error("could not validate %s: %s", directory, exc)
        with self._lock:
            if self.error is None:
                self.error = CommitError(
                    f"the validation of {self.experiment.location.join(directory).display} "
                    f"could not be started or its outcome recorded: {exc}. The checkpoint is "
                    "committed and awaits validation; a resumed run validates it (check the "
                    "storage, and ValidationConfig's sbatch options, first).")
                self.error.__cause__ = exc

    def raise_error(self) -> None:
        """At each collective step (rank 0): a validation that could not be recorded."""
        with self._lock:
            error, self.error = self.error, None
        if error is not None:
            raise error

    def _validate(self, directory: str, place: int | None) -> None:
        record = _awaiting(self.experiment, directory)
        if record is None or record.validation is None:
            return  # evicted, or ended already
        checkpoint = checkpoint_at(self.experiment.location.join(directory))
        if self._cancelled:
            return
        # Outside the lock: a start may wait seconds (sbatch until Slurm answers, a send to a
        # busy validation rank), and submit(), called as checkpoints commit, must not.
        running = self._start(place, checkpoint, record.validation)
        with self._lock:
            self._running[place] = running
            cancelled = self._cancelled
        if cancelled:  # cancel() came while it started, and could not stop it
            running.kill()
            running.close()
            return
        faults.reached("validating", 0)
        try:
            ended = running.outcome()
        finally:
            running.close()
        with self._lock:
            if self._cancelled or ended is None:
                return  # stopped by cancel(): still pending, for the resumed run
        self.experiment.record_validation(directory, ended, self.retention)
        if ended.status == VALIDATED:
            log.info("%s validated: %s", directory, ended.metrics)
        else:
            log.warning("%s: %s (%s)", directory, ended.status, ended.error)

    def _start(self, place: int | None, checkpoint: Checkpoint,
               validation: Validation) -> child.Local | Remote:
        if self.pool is not None and place is not None:
            return Remote(self.pool, place, checkpoint, validation)
        return child.Local(self.payload, checkpoint, validation, self.config)


def _awaiting(experiment: Experiment, directory: str) -> CheckpointRecord | None:
    return next((r for r in experiment.manifest.awaiting_validation if r.directory == directory),
                None)


def for_attempt(job: TrainingJob, experiment: Experiment | None, settings: Settings,
                pool: Pool | None = None) -> Validator | None:
    """Rank 0's, where the trainer validates; it first takes up the validations that an
    earlier attempt left pending. A run without validation_config leaves them pending."""
    if experiment is None:
        return None
    if job.validation_config is None:
        if experiment.manifest.awaiting_validation:
            log.warning("%d checkpoint(s) await validation, but this trainer has no "
                        "validation_config; they stay pending",
                        len(experiment.manifest.awaiting_validation))
        return None
    validator = Validator(experiment, job.validation_config, job.run_config.checkpoint_config,
                          _payload_dir(experiment, job.validation_config, settings), pool)
    validator.resume()
    return validator


def _payload_dir(experiment: Experiment, config: ValidationConfig,
                 settings: Settings) -> str | None:
    """Where the validation processes find the function and their tasks: node-local, or for
    Slurm jobs on other nodes the experiment's staging directory (cleared at the next run)."""
    if config.sbatch is None:
        return settings.local_dir
    if not experiment.location.is_local:
        raise ConfigError(
            f"ValidationConfig(sbatch=...) needs a POSIX storage_path that the validation "
            f"jobs' nodes see; {experiment.location.display} is not one. Validate on rank 0's "
            "node (leave sbatch out), or store the experiment on a shared filesystem.")
    if shutil.which("sbatch") is None:
        raise ConfigError("ValidationConfig(sbatch=...) submits each validation with sbatch, "
                          "which is not on PATH here; run where Slurm's commands are, or "
                          "leave sbatch out to validate on rank 0's node.")
    return os.path.join(experiment.location.path, STAGING_NAME, "validation")
