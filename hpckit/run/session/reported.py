"""``get_all_reported_checkpoints()`` and its types, as in Ray Train 2.60."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from hpckit.checkpoint import Checkpoint, checkpoint_at
from hpckit.errors import ConfigError
from hpckit.experiment import retention
from hpckit.experiment.manifest import CheckpointRecord
from hpckit.experiment.reading import require_manifest
from hpckit.run.session.session import current
from hpckit.storage.location import Location


class ReportedCheckpointStatus(Enum):
    """Where a reported checkpoint stands: ``COMMITTED`` (no validation asked), or its
    validation's status as the manifest records it."""

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


class CheckpointConsistencyMode(Enum):
    """What :func:`get_all_reported_checkpoints` waits for: the commits (``COMMITTED``), or
    also the end of every validation (``VALIDATED``)."""

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


@dataclass(frozen=True)
class ReportedCheckpoint:
    """A committed checkpoint with its metrics (a validation's merged in) and status.

    Args:
        checkpoint: The committed checkpoint, in the experiment's directory.
        metrics: Its report's metrics as the manifest stores them (JSON values), with a
            validation's metrics merged over them.
        status: ``COMMITTED`` (the default) where no validation was asked, else the
            validation's status.
    """

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus = ReportedCheckpointStatus.COMMITTED


POLL_S = 0.2


def get_all_reported_checkpoints(
        consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
        timeout_s: float | None = None) -> list[ReportedCheckpoint]:
    """Every checkpoint of this experiment that is kept, this run's and those of the runs it
    resumed, worst to best by the retention score (best last; report order without a score).

    Any rank may call it, any number of times: it reads the manifest, which every rank sees.
    A synchronous report's checkpoint is listed once ``report()`` has returned; an
    asynchronous one once it is committed (at a later report, or at the end of the run).
    With ``VALIDATED`` (the default, as in Ray) it first waits until no kept checkpoint
    awaits validation, or ``timeout_s`` has passed (then it returns what stands, as Ray
    does); rank 0's validation thread records each outcome while the ranks train.

    Args:
        consistency_mode: ``VALIDATED`` (the default) waits for every kept checkpoint's
            validation to end; ``COMMITTED`` lists the committed checkpoints at once.
        timeout_s: With ``VALIDATED``, the most seconds to wait; None (the default) waits
            as long as a validation is pending. Ignored with ``COMMITTED``.

    Returns:
        The kept checkpoints, worst to best.

    Raises:
        ConfigError: ``consistency_mode`` is not a ``CheckpointConsistencyMode``.
        ManifestError: The experiment's manifest cannot be read.
        HpckitError: Called outside a training run.
    """
    if not isinstance(consistency_mode, CheckpointConsistencyMode):
        raise ConfigError(f"get_all_reported_checkpoints(consistency_mode={consistency_mode!r}) "
                          "must be a CheckpointConsistencyMode (COMMITTED or VALIDATED).")
    location: Location = current("get_all_reported_checkpoints").context.experiment
    manifest = require_manifest(location)
    if consistency_mode is CheckpointConsistencyMode.VALIDATED:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while manifest.awaiting_validation and (deadline is None or time.monotonic() < deadline):
            time.sleep(POLL_S)
            manifest = require_manifest(location)
    return [ReportedCheckpoint(checkpoint_at(location.join(r.directory)), r.metrics, _status(r))
            for r in reversed(retention.ranked(manifest))]


def _status(record: CheckpointRecord) -> ReportedCheckpointStatus:
    if record.validation is None:
        return ReportedCheckpointStatus.COMMITTED
    return ReportedCheckpointStatus(record.validation.status)
