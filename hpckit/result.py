"""Result: what a run produced, from fit() or read back later with Result.from_path."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pyarrow
import pyarrow.fs

from hpckit.checkpoint import Checkpoint
from hpckit.errors import ConfigError, TrainingFailedError
from hpckit.experiment import retention as _retention
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.manifest import Manifest
from hpckit.experiment.reading import read_metrics, require_manifest
from hpckit.storage.location import Location, resolve

__all__ = ["Result"]


@dataclass
class Result:
    """The outcome of a run: latest and best checkpoints, last metrics, and where it all is."""

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]]
    path: str
    filesystem: pyarrow.fs.FileSystem
    metrics_history: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None
    _location: Location | None = field(default=None, repr=False)
    _manifest: Manifest | None = field(default=None, repr=False)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str],
                  storage_filesystem: pyarrow.fs.FileSystem | None = None) -> Result:
        """Read an experiment directory (local or remote) written by an earlier run."""
        return cls._read(resolve(path, storage_filesystem))

    @classmethod
    def _read(cls, experiment: Location) -> Result:
        return cls._build(experiment, require_manifest(experiment), read_metrics(experiment))

    @classmethod
    def _build(cls, experiment: Location, manifest: Manifest,
               history: list[dict[str, Any]]) -> Result:
        ranked = _retention.ranked(manifest)
        latest = manifest.latest
        last = history[-1]["metrics"] if history else None
        return cls(
            metrics=last,
            checkpoint=Checkpoint._at(experiment.join(latest.directory)) if latest else None,
            best_checkpoints=[(Checkpoint._at(experiment.join(r.directory)), r.metrics) for r in ranked],
            path=experiment.path, filesystem=experiment.filesystem,
            metrics_history=[entry["metrics"] for entry in history],
            error=_attempt_error(manifest), _location=experiment, _manifest=manifest)

    @property
    def metrics_dataframe(self) -> pyarrow.Table:
        """Every report as a row (step, time, checkpoint, then each metric; nested metrics
        flattened as ``a/b``). ``.to_pandas()`` gives a pandas DataFrame where pandas is
        installed."""
        entries = (read_metrics(self._location) if self._location is not None
                   else [{"metrics": m} for m in self.metrics_history])
        rows = [{**{k: e[k] for k in ("step", "time", "checkpoint") if k in e},
                 **_flatten(e["metrics"])} for e in entries]
        return pyarrow.Table.from_pylist(rows)

    def get_best_checkpoint(self, metric: str, mode: str = "max") -> Checkpoint | None:
        """The kept checkpoint with the best ``metric`` (``mode`` "max" or "min")."""
        if mode not in ("max", "min"):
            raise ConfigError(f"get_best_checkpoint(mode={mode!r}) must be 'max' or 'min'.")
        if self._manifest is None or self._location is None:
            return None
        scored = [r for r in self._manifest.checkpoints
                  if _retention.score_of(r.metrics, metric) is not None]
        if not scored:
            return None
        best = _retention.rank_best_first(scored, metric, mode)[0]
        return Checkpoint._at(self._location.join(best.directory))


def _flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _attempt_error(manifest: Manifest) -> BaseException | None:
    last = manifest.last_attempt
    if last is not None and last.status is AttemptStatus.FAILED:
        return TrainingFailedError(last.error or "the last attempt failed")
    return None
