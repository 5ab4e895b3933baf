"""Nested dicts (metrics, configs) as one level, their keys joined; a report's metrics as
the columns of a table."""

from __future__ import annotations

import json
from typing import Any

# The columns a metrics table starts with, hpckit's own: a metric of the same name is kept
# apart as "metrics/NAME", so every column is named once and "step" is always hpckit's.
OWN_COLUMNS = ("step", "time", "checkpoint")


def flatten(mapping: dict[str, Any], separator: str = "/", prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a/b": 1}`` (Ray's ``flatten_dict`` for metrics); an empty
    dict stays a value."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, separator, f"{prefix}{key}{separator}"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def metric_columns(metrics: dict[str, Any]) -> dict[str, Any]:
    """A report's metrics as table columns: nested ones flattened as ``a/b``, a name of
    :data:`OWN_COLUMNS` as ``metrics/NAME``, a list or dict as its JSON text (a column of
    mixed lists is no Arrow type, and a CSV cell is text)."""
    columns = {}
    for key, value in flatten(metrics).items():
        name = f"metrics/{key}" if key in OWN_COLUMNS else key
        columns[name] = json.dumps(value) if isinstance(value, (list, dict)) else value
    return columns
