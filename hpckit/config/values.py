"""What the config objects' checks share."""

from __future__ import annotations

from typing import Any


def is_int(value: Any) -> bool:
    """An int, and not a bool (``True`` is an int to Python, not a count to a person)."""
    return isinstance(value, int) and not isinstance(value, bool)
