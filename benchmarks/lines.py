"""Where a benchmark's figures go: one JSON line each on stdout, and appended to ``--out``."""

from __future__ import annotations

import json

_out: str | None = None


def write_to(path: str | None) -> None:
    """Also append every figure to ``path`` (None: stdout only)."""
    global _out
    _out = path


def emit(**figures: object) -> None:
    line = json.dumps(figures)
    print(line, flush=True)
    if _out:
        with open(_out, "a") as f:
            f.write(line + "\n")
