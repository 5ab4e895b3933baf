"""Values a test run computes once, whichever worker asks first: the parameters of a
reference run, say. Under pytest-xdist each worker has a session of its own, so a
session-scoped fixture runs on each; a value made through :func:`computed_once` is kept as
JSON in the run's shared temporary directory, under a lock, and the other worker reads it."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def computed_once(factory: pytest.TempPathFactory, name: str, compute: Callable[[], T]) -> T:
    """``compute()``'s value (JSON: lists come back as lists), computed once a test run."""
    base = factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    kept = shared / f"once-{name}.json"
    with open(shared / f"once-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if kept.exists():
            value: T = json.loads(kept.read_text())
            return value
        value = compute()
        kept.write_text(json.dumps(value))
        return value
