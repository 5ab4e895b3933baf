"""Rank 0's calls of the run's UserCallbacks, in report order."""

from __future__ import annotations

from typing import Any

from hpckit.checkpoint import Checkpoint
from hpckit.config.callbacks import TrainRunContext, UserCallback


class Callbacks:
    """The run's callbacks and the per-rank metrics of the reports not yet recorded."""

    def __init__(self, callbacks: list[UserCallback], context: TrainRunContext) -> None:
        self.callbacks = list(callbacks)
        self.context = context
        self._heard: dict[int, list[dict[str, Any]]] = {}

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def heard(self, step: int, metrics: list[dict[str, Any]]) -> None:
        """Every rank's metrics of the report at ``step`` (rank 0, when it plans it)."""
        if self.callbacks:
            self._heard[step] = metrics

    def recorded(self, step: int, checkpoint: Checkpoint | None) -> None:
        """The report at ``step`` is in the metrics log (and its checkpoint committed)."""
        metrics = self._heard.pop(step, None)
        if metrics is None:
            return
        for callback in self.callbacks:
            callback.after_report(self.context, metrics, checkpoint)

    def failed(self, worker_exceptions: dict[int, BaseException]) -> None:
        for callback in self.callbacks:
            callback.after_exception(self.context, worker_exceptions)
