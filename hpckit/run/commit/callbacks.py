"""Rank 0's calls of the run's UserCallbacks, in report order, outside the collectives.

The coordinator notes each report as it is recorded (inside rank 0's commit step); the calls are
made once the step is over, so a slow or failing callback cannot leave a commit half told.
A callback that raises is reported at the next ``report()`` (or at the end of the training
function) as a ``ControllerError`` on every rank, as Ray reports its controller's failures.
Reports are noted by rank 0's main thread (a synchronous commit) and by its commit thread (a
background one) while the main thread takes the due calls: one lock guards what is noted.
"""

from __future__ import annotations

import threading
from typing import Any

from hpckit.checkpoint import Checkpoint
from hpckit.config.callbacks import TrainRunContext, UserCallback
from hpckit.logs import log


class Callbacks:
    """The run's callbacks, the per-rank metrics of reports not yet recorded, and the
    recorded reports whose calls are due."""

    def __init__(self, callbacks: list[UserCallback], context: TrainRunContext) -> None:
        self.callbacks = list(callbacks)
        self.context = context
        self.error: BaseException | None = None
        self._heard: dict[int, list[dict[str, Any]]] = {}
        self._due: list[tuple[list[dict[str, Any]], Checkpoint | None]] = []
        self._noting = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def heard(self, step: int, metrics: list[dict[str, Any]]) -> None:
        """Every rank's metrics of the report at ``step`` (rank 0, when it plans it)."""
        if self.callbacks:
            with self._noting:
                self._heard[step] = metrics

    def recorded(self, step: int, checkpoint: Checkpoint | None) -> None:
        """The report at ``step`` is in the metrics log (and its checkpoint committed)."""
        with self._noting:
            metrics = self._heard.pop(step, None)
            if metrics is not None:
                self._due.append((metrics, checkpoint))

    def call_due(self) -> None:
        """Rank 0, after a collective step: ``after_report`` for each report recorded in it."""
        with self._noting:
            due, self._due = self._due, []
        for metrics, checkpoint in due:
            for callback in self.callbacks:
                if self.error is not None:
                    return
                try:
                    callback.after_report(self.context, metrics, checkpoint)
                except Exception as exc:
                    log.error("%s.after_report failed: %s", type(callback).__name__, exc,
                              exc_info=True)
                    self.error = exc

    def failed(self, worker_exceptions: dict[int, BaseException]) -> None:
        """``after_exception``; its own failure is logged, not raised over the run's."""
        for callback in self.callbacks:
            try:
                callback.after_exception(self.context, worker_exceptions)
            except Exception as exc:
                log.error("%s.after_exception failed: %s", type(callback).__name__, exc,
                          exc_info=True)
