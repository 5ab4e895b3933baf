"""Rank-aware logging: rank 0 logs at INFO, other ranks at WARNING, unless HPCKIT_LOG_LEVEL says.

Ground layer: imports only :mod:`hpckit.settings`.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from hpckit import settings

log = logging.getLogger("hpckit")

_FORMAT = "%(asctime)s hpckit[rank %(rank)s] %(levelname)s %(message)s"


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


class _Handler(logging.StreamHandler):
    """hpckit's own handler, told apart from handlers a user adds."""


class _JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors (``LoggingConfig(encoding="JSON")``)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
                           "level": record.levelname, "rank": getattr(record, "rank", None),
                           "message": record.getMessage()})


def configure(rank: int, level: str | None = None, encoding: str = "TEXT") -> None:
    """Give the ``hpckit`` logger a rank prefix and this rank's level; safe to call again.

    ``level`` is rank 0's, and every rank's at DEBUG (the others log at least warnings);
    without it ``HPCKIT_LOG_LEVEL`` where set, else INFO on rank 0 and WARNING elsewhere."""
    if level and (rank == 0 or level == "DEBUG"):
        chosen = level
    elif level:
        chosen = max(level, "WARNING", key=logging.getLevelName)
    else:
        chosen = settings.current().log_level or ("INFO" if rank == 0 else "WARNING")
    handler = next((h for h in log.handlers if isinstance(h, _Handler)), None)
    if handler is None:
        handler = _Handler(sys.stderr)
        log.addHandler(handler)
        log.propagate = False
    handler.setFormatter(_JsonFormatter() if encoding == "JSON"
                         else logging.Formatter(_FORMAT, "%H:%M:%S"))
    handler.filters = [_RankFilter(rank)]
    log.setLevel(chosen)


def debugging() -> bool:
    """Whether the user asked for tracebacks (``HPCKIT_LOG_LEVEL=DEBUG``)."""
    return log.isEnabledFor(logging.DEBUG)


def metrics_summary(metrics: dict[str, Any], most: int = 6) -> str:
    """The first few scalar metrics, compactly: ``loss=0.1234 acc=0.91``."""
    shown = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
             for k, v in metrics.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    return " ".join(shown[:most]) + (" ..." if len(shown) > most else "") or "(no metrics)"


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
