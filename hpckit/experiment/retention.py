"""Which committed checkpoints to keep: pure functions over manifest records."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hpckit.config import CheckpointConfig
from hpckit.experiment.manifest import CheckpointRecord, Manifest
from hpckit.experiment.values import flatten


def score_of(metrics: dict[str, Any], attribute: str) -> float | None:
    """The metric named ``attribute``, or None when missing or NaN. Nested metrics are named
    as Ray names them, their keys joined with ``/``: ``a/b/c`` is found in ``{"a": {"b":
    {"c": 1}}}``, ``{"a": {"b/c": 1}}`` and ``{"a/b": {"c": 1}}`` alike."""
    value: Any = metrics.get(attribute)
    if value is None and "/" in attribute:
        value = flatten(metrics).get(attribute)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)




def rank_best_first(records: Sequence[CheckpointRecord], attribute: str | None,
                    order: str = "max") -> list[CheckpointRecord]:
    """Records best first. Missing or NaN scores rank worst under both orders; ties keep the newer."""
    if attribute is None:
        return sorted(records, key=lambda r: r.index, reverse=True)
    sign = 1.0 if order == "max" else -1.0

    def key(record: CheckpointRecord) -> tuple[bool, float, int]:
        score = score_of(record.metrics, attribute)
        return (score is not None, sign * score if score is not None else 0.0, record.index)

    return sorted(records, key=key, reverse=True)


def ranked(manifest: Manifest) -> list[CheckpointRecord]:
    """The manifest's kept checkpoints, best first by the retention it records."""
    return rank_best_first(manifest.checkpoints, manifest.retention.get("checkpoint_score_attribute"),
                           manifest.retention.get("checkpoint_score_order", "max"))


def recorded_config(manifest: Manifest, num_to_keep: int | None) -> CheckpointConfig:
    """The manifest's retention, with another ``num_to_keep``."""
    return CheckpointConfig(num_to_keep, manifest.retention.get("checkpoint_score_attribute"),
                            manifest.retention.get("checkpoint_score_order", "max"))


def select_evictions(records: Sequence[CheckpointRecord],
                     config: CheckpointConfig) -> list[CheckpointRecord]:
    """Records that retention deletes: all but the ``num_to_keep`` best, the latest, and
    those awaiting validation (their score is not known yet). A validated checkpoint ranks
    by its merged metrics, the validation's included."""
    if config.num_to_keep is None or not records:
        return []
    awaiting = [r for r in records if r.validation is not None and r.validation.pending]
    ranked = rank_best_first([r for r in records if r not in awaiting],
                             config.checkpoint_score_attribute, config.checkpoint_score_order)
    keep = {r.index for r in ranked[: config.num_to_keep]} | {r.index for r in awaiting}
    keep.add(max(r.index for r in records))
    return [r for r in records if r.index not in keep]


def record(config: CheckpointConfig) -> dict[str, Any]:
    """What the manifest records of the retention: the fields that decide what is kept."""
    return {"num_to_keep": config.num_to_keep,
            "checkpoint_score_attribute": config.checkpoint_score_attribute,
            "checkpoint_score_order": config.checkpoint_score_order}
