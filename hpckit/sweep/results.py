"""ResultGrid: the trials of a sweep as Ray Tune returns them, one :class:`Result` each."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pyarrow

from hpckit.errors import ConfigError, TrainingFailedError
from hpckit.experiment.retention import score_of
from hpckit.experiment.values import flatten
from hpckit.result import Result
from hpckit.sweep.record import ERROR, TERMINATED, SweepManifest


class ResultGrid:
    """As ``ray.tune.ResultGrid``: indexing, iteration, ``errors``, ``num_errors``,
    ``num_terminated``, ``get_best_result()`` and ``get_dataframe()`` (a pyarrow Table;
    ``.to_pandas()`` where pandas is installed).

    ``Tuner.fit()`` and ``Tuner.get_results()`` build it.

    Args:
        results: One :class:`Result` per trial, in the sweep's trial order.
        manifest: The sweep's record: each trial's id, status, config and error, and
            ``TuneConfig``'s metric and mode.
        path: The sweep's directory.
    """

    def __init__(self, results: list[Result], manifest: SweepManifest, path: str) -> None:
        self._results = results
        self._manifest = manifest
        self.experiment_path = path

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> Result:
        return self._results[index]

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    def __repr__(self) -> str:
        return (f"ResultGrid({len(self)} trials at {self.experiment_path}: "
                f"{self.num_terminated} terminated, {self.num_errors} errors)")

    @property
    def errors(self) -> list[BaseException]:
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        return sum(t.status == ERROR for t in self._manifest.trials)

    @property
    def num_terminated(self) -> int:
        return sum(t.status == TERMINATED for t in self._manifest.trials)

    def get_best_result(self, metric: str | None = None, mode: str | None = None,
                        scope: str = "last", filter_nan_and_inf: bool = True) -> Result:
        """The trial with the best ``metric`` (TuneConfig's by default): in its last report
        (``scope="last"``) or in any of its reports (``"all"``).

        Args:
            metric: The metric to rank by (``a/b`` for a nested one); None (the default):
                ``TuneConfig(metric)``.
            mode: ``"max"`` or ``"min"``; None (the default): ``TuneConfig(mode)``.
            scope: ``"last"`` (the default) or ``"all"``; Ray's ``"avg"`` and
                ``"last-N-avg"`` are not accepted.
            filter_nan_and_inf: Leave out infinite scores (True, the default); a NaN score
                never ranks.

        Raises:
            ConfigError: No metric or mode is given or set, or ``scope`` is neither value.
            TrainingFailedError: No trial reported ``metric`` (finite, where filtered).
        """
        metric = metric or self._manifest.metric
        mode = mode or self._manifest.mode
        if metric is None or mode not in ("max", "min"):
            raise ConfigError("get_best_result() needs a metric and a mode ('max' or 'min'): "
                              "pass them, or set TuneConfig(metric=..., mode=...).")
        if scope not in ("last", "all"):
            raise ConfigError(f"get_best_result(scope={scope!r}) must be 'last' or 'all'.")
        sign = 1.0 if mode == "max" else -1.0
        scored = [(score, index) for index, result in enumerate(self._results)
                  if (score := _score(result, metric, scope, filter_nan_and_inf, sign)) is not None]
        if not scored:
            raise TrainingFailedError(f"no trial of {self.experiment_path} reported {metric!r}"
                                      f"{' (finite)' if filter_nan_and_inf else ''}; see "
                                      "hpckit ls " + self.experiment_path)
        return self._results[max(scored)[1]]

    def get_dataframe(self) -> pyarrow.Table:
        """One row per trial: its index, status, error, params (``config/...``) and last
        metrics."""
        rows = []
        for trial, result in zip(self._manifest.trials, self._results, strict=True):
            rows.append({"trial_id": trial.trial_id, "status": trial.status,
                         "error": trial.error, "path": result.path,
                         **{f"config/{k}": v for k, v in flatten(trial.config).items()},
                         **flatten(result.metrics or {})})
        return pyarrow.Table.from_pylist(rows)


def _score(result: Result, metric: str, scope: str, finite: bool, sign: float) -> float | None:
    """The trial's score, signed so that higher is better."""
    reports = result.metrics_history if scope == "all" else result.metrics_history[-1:]
    scores = [sign * s for m in reports if (s := score_of(m, metric)) is not None
              and (math.isfinite(s) or not finite)]
    return max(scores) if scores else None
