"""Rank 0's validations, in report order, in threads of their own: training never waits
for them, except at the end of a run that finished, which waits for the last. One runs at a
time on rank 0's node or in Slurm jobs (Ray's one in flight), one on each rank set aside."""

from __future__ import annotations

import os
import shutil
import threading
from collections import deque

from hpckit import faults
from hpckit.checkpoint import Checkpoint
from hpckit.config import CheckpointConfig, ValidationConfig
from hpckit.errors import ConfigError
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.manifest import STAGING_NAME, CheckpointRecord
from hpckit.experiment.validation import VALIDATED, Validation
from hpckit.logs import log
from hpckit.processes import background_thread
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
        self._waiting: deque[str] = deque()
        self._running: dict[int | None, child.Local | Remote] = {}
        self._busy = 0  # validations taken from the queue and not yet ended
        self._changed = threading.Condition()
        self._cancelled = False
        self._threads: list[threading.Thread] = []

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
        with self._changed:
            self._waiting.append(directory)
            if not self._threads:
                places: tuple[int | None, ...] = self.pool.ranks if self.pool else (None,)
                self._threads = [threading.Thread(target=self._work, args=(place,),
                                                  name="hpckit-validation", daemon=True)
                                 for place in places]
                for thread in self._threads:
                    thread.start()
            self._changed.notify_all()

    def finish(self) -> None:
        """At the end of a run that finished: wait until every validation has ended."""
        with self._changed:
            if self._waiting or self._busy:
                log.info("waiting for %d validation(s) to end", len(self._waiting) + self._busy)
            while self._waiting or self._busy:
                self._changed.wait()

    def cancel(self) -> None:
        """A run that stops or fails: the validations running are stopped and those queued
        are left pending in the manifest, for the resumed run to do."""
        with self._changed:
            self._cancelled = True
            self._waiting.clear()
            running = list(self._running.values())
            self._changed.notify_all()
        for validation in running:
            validation.kill()
        for thread in self._threads:
            thread.join(timeout=10)
        child.remove_payload(self.payload, self.config)

    def _work(self, place: int | None) -> None:
        """One place's thread: rank 0's node (None) or a rank set aside."""
        background_thread()
        while True:
            with self._changed:
                while not self._waiting and not self._cancelled:
                    self._changed.wait()
                if self._cancelled:
                    return
                directory = self._waiting.popleft()
                self._busy += 1
            try:
                self._validate(directory, place)
            except Exception as exc:  # noqa: BLE001  (the thread must go on: say it, go on)
                log.warning("could not validate %s: %r", directory, exc)
            finally:
                with self._changed:
                    self._busy -= 1
                    self._running.pop(place, None)
                    self._changed.notify_all()

    def _validate(self, directory: str, place: int | None) -> None:
        record = _awaiting(self.experiment, directory)
        if record is None or record.validation is None:
            return  # evicted, or ended already
        checkpoint = Checkpoint._at(self.experiment.location.join(directory))
        with self._changed:
            if self._cancelled:
                return
            running = self._start(place, checkpoint, record.validation)
            self._running[place] = running
        faults.reached("validating", 0)
        try:
            ended = running.outcome()
        finally:
            running.close()
        with self._changed:
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
