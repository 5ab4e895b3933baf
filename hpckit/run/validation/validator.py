"""Rank 0's validations, one at a time in report order, in a thread of their own: training
never waits for them, except at the end of a run that finished, which waits for the last."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections import deque

from hpckit import faults
from hpckit.checkpoint import Checkpoint
from hpckit.config import CheckpointConfig, ValidationConfig
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.manifest import CheckpointRecord
from hpckit.experiment.validation import VALIDATED
from hpckit.logs import log
from hpckit.processes import background_thread
from hpckit.run.job import TrainingJob
from hpckit.run.validation import child
from hpckit.settings import Settings


class Validator:
    """Validates the checkpoints it is given, and records how each validation ended."""

    def __init__(self, experiment: Experiment, config: ValidationConfig,
                 retention: CheckpointConfig, local_dir: str | None) -> None:
        self.experiment = experiment
        self.config = config
        self.retention = retention
        self.payload = tempfile.mkdtemp(prefix="hpckit-validate-", dir=local_dir)
        child.write_function(self.payload, config)
        self._queue: deque[str] = deque()
        self._changed = threading.Condition()
        self._running: subprocess.Popen[bytes] | None = None
        self._cancelled = False
        self._thread: threading.Thread | None = None

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
            self._queue.append(directory)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="hpckit-validation",
                                                daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def finish(self) -> None:
        """At the end of a run that finished: wait until every validation has ended."""
        waiting = len(self._queue)  # the one running included
        if waiting:
            log.info("waiting for %d validation(s) to end", waiting)
        with self._changed:
            while self._queue or self._running is not None:
                self._changed.wait()

    def cancel(self) -> None:
        """A run that stops or fails: the validation running is stopped and those queued are
        left pending in the manifest, for the resumed run to do."""
        with self._changed:
            self._cancelled = True
            self._queue.clear()
            running = self._running
            self._changed.notify_all()
        if running is not None and running.poll() is None:
            running.kill()
        if self._thread is not None:
            self._thread.join(timeout=10)
        shutil.rmtree(self.payload, ignore_errors=True)

    def _work(self) -> None:
        background_thread()
        while True:
            with self._changed:
                while not self._queue and not self._cancelled:
                    self._changed.wait()
                if self._cancelled:
                    return
                directory = self._queue[0]
            try:
                self._validate(directory)
            except Exception as exc:  # noqa: BLE001  (the thread must go on: say it, go on)
                log.warning("could not validate %s: %r", directory, exc)
            with self._changed:
                if self._queue and self._queue[0] == directory:
                    self._queue.popleft()
                self._running = None
                self._changed.notify_all()

    def _validate(self, directory: str) -> None:
        record = _awaiting(self.experiment, directory)
        if record is None or record.validation is None:
            return  # evicted, or ended already
        checkpoint = Checkpoint._at(self.experiment.location.join(directory))
        with self._changed:
            if self._cancelled:
                return
            self._running, work = child.start(self.payload, checkpoint, record.validation,
                                              self.config.threads)
        faults.reached("validating", 0)
        ended = child.outcome(self._running, work, record.validation)
        shutil.rmtree(work, ignore_errors=True)
        with self._changed:
            if self._cancelled:
                return  # stopped by cancel(): still pending, for the resumed run
        self.experiment.record_validation(directory, ended, self.retention)
        if ended.status == VALIDATED:
            log.info("%s validated: %s", directory, ended.metrics)
        else:
            log.warning("%s: %s (%s)", directory, ended.status, ended.error)


def _awaiting(experiment: Experiment, directory: str) -> CheckpointRecord | None:
    return next((r for r in experiment.manifest.awaiting_validation if r.directory == directory),
                None)


def for_attempt(job: TrainingJob, experiment: Experiment | None,
               settings: Settings) -> Validator | None:
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
                          settings.local_dir)
    validator.resume()
    return validator
