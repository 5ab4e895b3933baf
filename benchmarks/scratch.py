"""The storage a benchmark writes to: the user's directory, or a temporary one removed after."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def scratch_storage(path: str | None, prefix: str) -> Iterator[str]:
    """``path`` (created if missing, kept afterwards), or a new temporary directory."""
    storage = path or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(storage, exist_ok=True)
    try:
        yield storage
    finally:
        if path is None:
            shutil.rmtree(storage, ignore_errors=True)
