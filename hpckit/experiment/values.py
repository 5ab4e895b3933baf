"""Turn reported metrics into plain JSON values, naming the key when that is impossible.

Nested dicts (metrics, configs) as one level, their keys joined; a report's metrics as
the columns of a table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from hpckit.errors import MetricsError
from hpckit.storage.uris import redact


def to_json_metrics(metrics: Any) -> dict[str, Any]:
    """Convert numbers, 0-d/1-element tensors and numpy scalars; refuse anything else.

    Non-finite floats become None, so every file hpckit writes is strict JSON.
    """
    if not isinstance(metrics, Mapping):
        raise MetricsError(
            f"report() metrics must be a dict of name -> value, got {type(metrics).__name__} "
            f"({_short(metrics)}); e.g. hpckit.report({{'loss': 0.12}}).")
    return _convert_mapping(metrics, prefix="")


def _convert_mapping(mapping: Mapping[Any, Any], prefix: str) -> dict[str, Any]:
    out = {}
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise MetricsError(
                f"metric key {prefix}{key!r} is a {type(key).__name__}; metric names must be strings.")
        out[key] = _convert(value, f"{prefix}{key}")
    return out


def _convert(value: Any, key: str) -> Any:
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return _convert_mapping(value, prefix=f"{key}/")
    if isinstance(value, (list, tuple)):
        return [_convert(v, f"{key}[{i}]") for i, v in enumerate(value)]
    scalar = _scalar(value)
    if scalar is not None:
        return _convert(scalar, key)
    raise MetricsError(
        f"metric {key!r} has a value of type {type(value).__name__} ({_short(value)}), which "
        "cannot be stored as JSON; report numbers, strings, booleans, one-element tensors, or "
        "lists/dicts of them.")


def _scalar(value: Any) -> Any:
    """The Python number inside a one-element tensor or numpy scalar/array, else None."""
    item = getattr(value, "item", None)
    if item is None:
        return None
    size = getattr(value, "numel", None)
    count = size() if callable(size) else getattr(value, "size", None)
    if count != 1:
        return None
    try:
        result = item()
    except (TypeError, ValueError, RuntimeError):
        return None
    return result if isinstance(result, (bool, int, float, str)) else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def jsonable(value: Any) -> Any:
    """The config as JSON for the manifest: secrets in URIs redacted, other objects repr'd."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    return repr(value)


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
