"""How the commands print values for people: tables with a header row, floats to six
significant digits, local date-times, sizes in KiB/MiB/GiB. ``--json`` prints the exact
values instead, for scripts."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

import click

SIGNIFICANT = 6
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def number(value: Any) -> str:
    """A metric as a person reads it: floats to six significant digits, others as they are."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{SIGNIFICANT}g}"
    if isinstance(value, (int, str)):
        return str(value)
    return json.dumps(value)


def moment(timestamp: float | None) -> str:
    """A time since the epoch as a local date-time to the second."""
    if not timestamp:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def size(count: int | None) -> str:
    """A byte count in B, KiB, MiB, GiB...: ``1536`` is ``1.5 KiB``."""
    if count is None:
        return "-"
    value = float(count)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("not reached")


def duration(seconds: float | None) -> str:
    """Seconds as ``42.0 s``, ``3m 05s`` or ``2h 07m``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def echo_table(header: Sequence[str], rows: Sequence[Sequence[str]],
               right: Sequence[bool] | None = None) -> None:
    """Print ``rows`` under ``header`` in aligned columns; ``right`` aligns numbers right."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    aligned = right or [False] * len(header)
    for row in [header, *rows]:
        cells = [cell.rjust(w) if r else cell.ljust(w)
                 for cell, w, r in zip(row, widths, aligned, strict=True)]
        click.echo("  ".join(cells).rstrip())


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=1))
