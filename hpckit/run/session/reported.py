"""``get_all_reported_checkpoints()`` and its types, as in Ray Train 2.60."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from hpckit.checkpoint import Checkpoint
from hpckit.errors import ConfigError
from hpckit.experiment import retention
from hpckit.experiment.reading import require_manifest
from hpckit.run.session.session import current
from hpckit.storage.location import Location


class ReportedCheckpointStatus(Enum):
    """Where a reported checkpoint stands. hpckit validates no checkpoint after its commit,
    so every checkpoint it lists is ``COMMITTED``; the other values are Ray's."""

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


class CheckpointConsistencyMode(Enum):
    """What :func:`get_all_reported_checkpoints` waits for. Without validation in hpckit,
    both mean: the checkpoints that the manifest has committed."""

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


@dataclass(frozen=True)
class ReportedCheckpoint:
    """A committed checkpoint with the metrics reported with it."""

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus = ReportedCheckpointStatus.COMMITTED


def get_all_reported_checkpoints(
        consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
        timeout_s: float | None = None) -> list[ReportedCheckpoint]:
    """Every checkpoint of this experiment that is kept, this run's and those of the runs it
    resumed, worst to best by the retention score (best last; report order without a score).

    Any rank may call it, any number of times: it reads the manifest, which every rank sees.
    A synchronous report's checkpoint is listed once ``report()`` has returned; an
    asynchronous one once it is committed (at a later report, or at the end of the run).
    ``timeout_s`` is accepted for Ray's signature; reading the manifest does not wait.
    """
    if not isinstance(consistency_mode, CheckpointConsistencyMode):
        raise ConfigError(f"get_all_reported_checkpoints(consistency_mode={consistency_mode!r}) "
                          "must be a CheckpointConsistencyMode (COMMITTED or VALIDATED).")
    location: Location = current("get_all_reported_checkpoints").context.experiment
    manifest = require_manifest(location)
    return [ReportedCheckpoint(Checkpoint._at(location.join(r.directory)), r.metrics)
            for r in reversed(retention.ranked(manifest))]
