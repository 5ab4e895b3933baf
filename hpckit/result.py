"""Result: what a run produced, from fit() or read back later with Result.from_path.

Built as Ray Train 2.60 builds its ``Result``: ``Result(metrics, checkpoint, error, path,
metrics_dataframe=None, best_checkpoints=None, _storage_filesystem=None, return_value=None)``,
with ``best_checkpoints`` ordered worst to best (``best_checkpoints[-1]`` is the best) and at
most ``num_to_keep`` long.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow
import pyarrow.fs

from hpckit.checkpoint import Checkpoint, checkpoint_at
from hpckit.errors import CheckpointError, ConfigError, TrainingFailedError
from hpckit.experiment import retention as _retention
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.manifest import Manifest
from hpckit.experiment.reading import read_metrics, require_manifest
from hpckit.experiment.values import OWN_COLUMNS, flatten, metric_columns
from hpckit.storage.location import Location, resolve

__all__ = ["Result"]


class Result:
    """The outcome of a run: latest and best checkpoints, last metrics, and where it all is.

    ``return_value`` is what the training function returned on rank 0 (None when it did not
    finish, or for a Result read back from storage); ``metrics_history`` is every report's
    metrics, oldest first (hpckit's own); ``config`` a sweep trial's params (else empty).

    ``fit()`` builds it, and :meth:`from_path` reads one back; the arguments are Ray's.

    Args:
        metrics: The last report's metrics (Ray: the latest checkpoint's), or None where
            nothing was reported.
        checkpoint: The latest committed checkpoint on storage, or None.
        error: Why the run failed, or None where it did not.
        path: The experiment directory, as a path on the storage filesystem.
        metrics_dataframe: What :attr:`metrics_dataframe` returns; None (the default) builds
            it from the metrics log (or from ``metrics_history``) when read.
        best_checkpoints: The kept checkpoints with their metrics, worst to best, at most
            ``num_to_keep``; None (the default) is ``[]``.
        return_value: What the training function returned on rank 0; None (the default)
            where it did not finish, or for a Result read from storage.
    """

    def __init__(self, metrics: dict[str, Any] | None, checkpoint: Checkpoint | None,
                 error: BaseException | None, path: str, metrics_dataframe: Any = None,
                 best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] | None = None,
                 _storage_filesystem: pyarrow.fs.FileSystem | None = None,
                 return_value: Any = None) -> None:
        self.metrics = metrics
        self.checkpoint = checkpoint
        self.error = error
        self.path = path
        self.best_checkpoints = list(best_checkpoints or [])
        self.filesystem = _storage_filesystem or pyarrow.fs.LocalFileSystem()
        self.return_value = return_value
        self.metrics_history: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {}  # a sweep trial's params, as Ray's Result.config
        self._metrics_dataframe = metrics_dataframe
        self._location: Location | None = None
        self._validated: dict[str, dict[str, Any]] = {}  # checkpoint directory: its metrics

    def __repr__(self) -> str:
        return (f"Result(metrics={self.metrics!r}, checkpoint={self.checkpoint!r}, "
                f"error={self.error!r}, path={self.path!r})")

    @classmethod
    def from_path(cls, path: str | os.PathLike[str],
                  storage_filesystem: pyarrow.fs.FileSystem | None = None) -> Result:
        """Read an experiment directory (local or remote) written by an earlier run; a path
        that is not one raises a ``ManifestError`` (a ``RuntimeError``, as in Ray).

        Args:
            path: The experiment directory: a local path or a URI; with
                ``storage_filesystem``, a path on it without a scheme.
            storage_filesystem: The pyarrow filesystem ``path`` is on; None (the default)
                finds it from ``path``.

        Raises:
            ManifestError: ``path`` is not an experiment directory, or its manifest cannot
                be read.
            StorageError: The storage cannot be opened or read.
        """
        return cls._read(resolve(path, storage_filesystem))

    @classmethod
    def _read(cls, experiment: Location, return_value: Any = None) -> Result:
        return cls._build(experiment, require_manifest(experiment), read_metrics(experiment),
                          return_value)

    @classmethod
    def _build(cls, experiment: Location, manifest: Manifest, history: list[dict[str, Any]],
               return_value: Any = None) -> Result:
        # Checkpoints only in node-local caches (CheckpointConfig(cache_dir)) are not readable
        # from here; a run's last checkpoint is always on storage_path.
        latest = max((r for r in manifest.checkpoints if r.on_storage), key=lambda r: r.index,
                     default=None)
        result = cls(
            metrics=_last_metrics(manifest, history),
            checkpoint=checkpoint_at(experiment.join(latest.directory)) if latest else None,
            error=_attempt_error(manifest), path=experiment.path,
            best_checkpoints=[(checkpoint_at(experiment.join(r.directory)), r.metrics)
                              for r in _worst_to_best(manifest) if r.on_storage],
            _storage_filesystem=experiment.filesystem, return_value=return_value)
        result._validated = {r.directory: r.validation.metrics for r in manifest.checkpoints
                             if r.validation is not None and r.validation.metrics}
        result.metrics_history = [result._merged(entry)["metrics"] for entry in history]
        result._location = experiment
        return result

    @property
    def metrics_dataframe(self) -> Any:
        """Every report as a row (step, time, checkpoint, then each metric: nested metrics
        flattened as ``a/b``, a metric named like those three as ``metrics/NAME``, a list as
        its JSON text), a pyarrow Table (``.to_pandas()`` gives a pandas DataFrame
        where pandas is installed); or the dataframe the Result was built with."""
        if self._metrics_dataframe is not None:
            return self._metrics_dataframe
        entries = ([self._merged(e) for e in read_metrics(self._location)]
                   if self._location is not None
                   else [{"metrics": m} for m in self.metrics_history])
        rows = [{**{k: e[k] for k in OWN_COLUMNS if k in e}, **metric_columns(e["metrics"])}
                for e in entries]
        # Every column any row has (pyarrow would take the first row's alone), in order.
        columns = list(dict.fromkeys(k for row in rows for k in row))
        return pyarrow.Table.from_pylist([{k: row.get(k) for k in columns} for row in rows])

    def _merged(self, entry: dict[str, Any]) -> dict[str, Any]:
        """A metrics log entry with its checkpoint's validation metrics merged in, as Ray
        updates a validated report's metrics in place."""
        validated = self._validated.get(entry.get("checkpoint") or "")
        return {**entry, "metrics": {**entry["metrics"], **validated}} if validated else entry

    def get_best_checkpoint(self, metric: str, mode: str = "max") -> Checkpoint:
        """The checkpoint of ``best_checkpoints`` with the best ``metric`` (``mode`` "max" or
        "min"; ``a/b`` names a nested metric). As in Ray: a ``RuntimeError`` when there is no
        checkpoint, or when none reported ``metric``.

        Args:
            metric: The metric to rank by (``a/b`` for a nested one); a NaN score is not a
                best checkpoint.
            mode: ``"max"`` (the default: higher is better) or ``"min"``.

        Raises:
            ConfigError: ``mode`` is neither.
            CheckpointError: The run has no kept checkpoint, or none reported ``metric``
                (a ``RuntimeError``, as in Ray).
        """
        if mode not in ("max", "min"):
            raise ConfigError(f"get_best_checkpoint(mode={mode!r}) must be 'max' or 'min'.")
        if not self.best_checkpoints:
            raise CheckpointError(f"{self.path} has no checkpoint: no report() of this run "
                                  "had one, or none was committed.")
        scored = [(score, checkpoint) for checkpoint, metrics in self.best_checkpoints
                  if (score := _retention.score_of(metrics, metric)) is not None]
        if not scored:
            names = sorted({k for _, m in self.best_checkpoints for k in flatten(m)})
            raise CheckpointError(f"no checkpoint of {self.path} reported the metric {metric!r}; "
                                  f"its checkpoints reported: {', '.join(names) or 'nothing'}.")
        sign = 1.0 if mode == "max" else -1.0
        return max(scored, key=lambda pair: sign * pair[0])[1]


def _worst_to_best(manifest: Manifest) -> list[Any]:
    """The kept checkpoints as Ray lists them: by the retention score, worst first, at most
    ``num_to_keep`` (the latest, kept beside the top K for resuming, is not one of them)."""
    ascending = list(reversed(_retention.ranked(manifest)))
    keep = manifest.retention.get("num_to_keep")
    return ascending[-keep:] if keep else ascending


def _attempt_error(manifest: Manifest) -> BaseException | None:
    last = manifest.last_attempt
    if last is not None and last.status in (AttemptStatus.FAILED, AttemptStatus.HUNG):
        return TrainingFailedError(last.error or "the last attempt failed")
    return None


def _last_metrics(manifest: Manifest, history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last report's metrics; where it carried a checkpoint that was validated, with the
    validation's metrics merged in (Ray updates that report's metrics in place)."""
    if not history:
        return None
    last = history[-1]
    record = next((r for r in manifest.checkpoints
                   if r.directory == last.get("checkpoint") and r.validation), None)
    metrics: dict[str, Any] = last["metrics"]
    return {**metrics, **(record.validation.metrics or {})} if record and record.validation \
        else metrics


def result_of(experiment: Location, manifest: Manifest, history: list[dict[str, Any]],
              return_value: Any = None) -> Result:
    """The :class:`Result` of a run that just ended, from what its ranks hold (the manifest
    and metrics that rank 0 sent every rank)."""
    return Result._build(experiment, manifest, history, return_value)


def result_read(experiment: Location, return_value: Any = None) -> Result:
    """The :class:`Result` of ``experiment``, read from storage (by the process that started
    the ranks, once they ended)."""
    return Result._read(experiment, return_value)
