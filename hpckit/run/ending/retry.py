"""How often a failed run is started again: one policy for every restart loop (a single rank
restarting itself, hpckit's launcher, ``hpckit run`` and ``hpckit resume``)."""

from __future__ import annotations

from dataclasses import dataclass

UNLIMITED = -1


@dataclass(frozen=True)
class RetryPolicy:
    """``max_failures`` restarts after failures; -1 restarts without limit."""

    max_failures: int = 0

    def allows(self, failed_attempt: int) -> bool:
        """Whether the attempt numbered ``failed_attempt`` (0 first) may be followed by another."""
        return self.max_failures == UNLIMITED or failed_attempt < self.max_failures

    def describe(self, restart: int) -> str:
        """``restart 2 of 3`` (or ``of unlimited``), for log lines."""
        limit = "unlimited" if self.max_failures == UNLIMITED else str(self.max_failures)
        return f"restart {restart} of {limit}"
