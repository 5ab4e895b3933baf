"""Nested dicts (metrics, configs) as one level, their keys joined."""

from __future__ import annotations

from typing import Any


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
