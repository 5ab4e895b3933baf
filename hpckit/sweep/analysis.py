"""ExperimentAnalysis: what ``tune.run`` returns, over the same ResultGrid a Tuner gives:
``trials`` (``config``, ``last_result``, ``status`` in Ray's names), ``get_best_config``,
``get_best_trial``, ``best_checkpoint``, ``get_trial_checkpoints_paths``, ``dataframe()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow

from hpckit.checkpoint import Checkpoint
from hpckit.errors import ConfigError
from hpckit.experiment.retention import score_of
from hpckit.experiment.values import flatten
from hpckit.result import Result
from hpckit.sweep.results import ResultGrid


@dataclass
class AnalysisTrial:
    """One trial as Ray's ``Trial`` shows it to an analysis."""

    trial_id: str
    config: dict[str, Any]
    status: str
    last_result: dict[str, Any]
    path: str
    error: str | None = None
    result: Result | None = field(default=None, repr=False)

    @property
    def logdir(self) -> str:
        return self.path

    @property
    def checkpoint(self) -> Checkpoint | None:
        return self.result.checkpoint if self.result is not None else None

    def __str__(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]


class ExperimentAnalysis:
    """As ``ray.tune.ExperimentAnalysis`` (``tune.run``'s return value).

    ``tune.run`` builds it over the sweep's :class:`ResultGrid`; Ray's reads a directory.

    Args:
        grid: The sweep's results.
        metric: The default metric of the methods below (``tune.run(metric)``), or None.
        mode: The default mode, ``"max"`` or ``"min"`` (``tune.run(mode)``), or None.
    """

    def __init__(self, grid: ResultGrid, metric: str | None, mode: str | None) -> None:
        self.grid = grid
        self.default_metric, self.default_mode = metric, mode
        trials = grid._manifest.trials  # noqa: SLF001 (the grid it was built with)
        self.trials = [AnalysisTrial(t.trial_id, result.config or {}, t.status,
                                     dict(result.metrics or t.last or {}), result.path, t.error,
                                     result)
                       for t, result in zip(trials, grid, strict=True)]
        self.experiment_path = grid.experiment_path

    def _pick(self, metric: str | None, mode: str | None) -> tuple[str, str]:
        metric, mode = metric or self.default_metric, mode or self.default_mode
        if metric is None or mode not in ("max", "min"):
            raise ConfigError("pass metric and mode ('max' or 'min'), or give tune.run(metric=..., "
                              "mode=...)")
        return metric, mode

    def get_best_trial(self, metric: str | None = None, mode: str | None = None,
                       scope: str = "last") -> AnalysisTrial | None:
        """The trial with the best ``metric``.

        Args:
            metric: The metric to rank by; None (the default): ``tune.run(metric)``.
            mode: ``"max"`` or ``"min"``; None (the default): ``tune.run(mode)``.
            scope: ``"last"`` (the default) ranks each trial by its last report, ``"all"``
                by its best.

        Raises:
            ConfigError: No metric or mode is given or set, or ``scope`` is neither value.
            TrainingFailedError: No trial reported ``metric``.
        """
        metric, mode = self._pick(metric, mode)
        best = self.grid.get_best_result(metric, mode, scope)
        return next(t for t in self.trials if t.result is best)

    def get_best_config(self, metric: str | None = None, mode: str | None = None,
                        scope: str = "last") -> dict[str, Any] | None:
        """The config of :meth:`get_best_trial`'s trial.

        Args:
            metric: As for :meth:`get_best_trial`.
            mode: As for :meth:`get_best_trial`.
            scope: As for :meth:`get_best_trial`.
        """
        trial = self.get_best_trial(metric, mode, scope)
        return trial.config if trial else None

    def get_best_checkpoint(self, trial: AnalysisTrial, metric: str | None = None,
                            mode: str | None = None) -> Checkpoint | None:
        """The kept checkpoint of ``trial`` with the best ``metric``.

        Args:
            trial: One of :attr:`trials`.
            metric: The metric to rank by; None (the default): ``tune.run(metric)``.
            mode: ``"max"`` or ``"min"``; None (the default): ``tune.run(mode)``.

        Raises:
            ConfigError: No metric or mode is given or set.
            CheckpointError: The trial has no kept checkpoint, or none reported ``metric``.
        """
        metric, mode = self._pick(metric, mode)
        return trial.result.get_best_checkpoint(metric, mode) if trial.result else None

    @property
    def best_trial(self) -> AnalysisTrial | None:
        return self.get_best_trial()

    @property
    def best_config(self) -> dict[str, Any] | None:
        return self.get_best_config()

    @property
    def best_checkpoint(self) -> Checkpoint | None:
        trial = self.get_best_trial()
        return self.get_best_checkpoint(trial) if trial else None

    @property
    def best_result(self) -> dict[str, Any]:
        trial = self.get_best_trial()
        return trial.last_result if trial else {}

    @property
    def results(self) -> dict[str, dict[str, Any]]:
        return {t.trial_id: t.last_result for t in self.trials}

    def get_trial_checkpoints_paths(self, trial: AnalysisTrial, metric: str | None = None
                                    ) -> list[tuple[str, Any]]:
        """(path, value of ``metric``) for each kept checkpoint of ``trial``, oldest first.

        Args:
            trial: One of :attr:`trials`.
            metric: The metric whose value is given (None where a checkpoint lacks it);
                None (the default): ``tune.run(metric)``, else ``training_iteration``.
        """
        metric = metric or self.default_metric or "training_iteration"
        kept = trial.result.best_checkpoints if trial.result else []
        return sorted(((c.path, score_of(m, metric)) for c, m in kept), key=lambda p: p[0])

    def dataframe(self, metric: str | None = None, mode: str | None = None) -> pyarrow.Table:
        """One row per trial (``.to_pandas()`` where pandas is installed): its last report,
        or with ``metric`` and ``mode`` its best one, as in Ray.

        Args:
            metric: The metric whose best report each row shows; None (the default), with
                no ``mode``: each trial's last report.
            mode: ``"max"`` or ``"min"``; None (the default), with a ``metric``:
                ``tune.run(mode)``.

        Raises:
            ConfigError: Only one of them is given and ``tune.run`` set no default for the
                other.
        """
        if metric is None and mode is None:
            return self.grid.get_dataframe()
        metric, mode = self._pick(metric, mode)
        sign = 1.0 if mode == "max" else -1.0
        rows = []
        for trial in self.trials:
            history = trial.result.metrics_history if trial.result else []
            scored = [m for m in history if score_of(m, metric) is not None]
            best = max(scored, key=lambda m: sign * (score_of(m, metric) or 0.0), default={})
            rows.append({"trial_id": trial.trial_id, "status": trial.status, "path": trial.path,
                         **{f"config/{k}": v for k, v in flatten(trial.config).items()},
                         **flatten(best)})
        return pyarrow.Table.from_pylist(rows)
