"""Rank-aware logging: rank 0 logs at INFO, other ranks at WARNING, unless HPCKIT_LOG_LEVEL says."""

from __future__ import annotations

import logging
import sys

from hpckit._env import Environment

log = logging.getLogger("hpckit")

_FORMAT = "%(asctime)s hpckit[rank %(rank)s] %(levelname)s %(message)s"


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def configure(rank: int, env: Environment | None = None) -> None:
    """Give the ``hpckit`` logger a rank prefix and this rank's level; safe to call again."""
    env = env or Environment.read()
    level = (env.log_level or ("INFO" if rank == 0 else "WARNING")).upper()
    if level not in logging.getLevelNamesMapping():
        level = "INFO"
    handler = next((h for h in log.handlers if getattr(h, "_hpckit", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler._hpckit = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))
        log.addHandler(handler)
        log.propagate = False
    handler.filters = [_RankFilter(rank)]
    log.setLevel(level)
