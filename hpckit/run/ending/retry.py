"""How often a failed run is started again: one policy for every restart loop (a single rank
restarting itself, hpckit's launcher, ``hpckit run`` and ``hpckit resume``)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from hpckit.errors import HpckitError, WorkerGroupError

UNLIMITED = -1


@dataclass(frozen=True)
class RetryPolicy:
    """``max_failures`` restarts after failures; -1 restarts without limit."""

    max_failures: int = 0

    def allows(self, failed_attempt: int, errors: Collection[BaseException] = ()) -> bool:
        """Whether the attempt numbered ``failed_attempt`` (0 first) may be followed by
        another; never where it failed with ``errors`` (each failed rank's, where known) that
        all recur (:func:`recurring`)."""
        if recurring(errors) is not None:
            return False
        return self.max_failures == UNLIMITED or failed_attempt < self.max_failures

    def describe(self, restart: int) -> str:
        """``restart 2 of 3`` (or ``of unlimited``), for log lines."""
        limit = "unlimited" if self.max_failures == UNLIMITED else str(self.max_failures)
        return f"restart {restart} of {limit}"


def recurring(errors: Collection[BaseException]) -> str | None:
    """Why a failure with ``errors`` is not restarted, where every one of them is a refusal of
    the program's own input (``HpckitError.recurs``) that a restart would meet again; None
    where a restart may help (or nothing is known of the errors)."""
    if not errors or not all(isinstance(e, HpckitError) and e.recurs for e in errors):
        return None
    kinds = ", ".join(sorted({type(e).__name__ for e in errors}))
    return (f"not restarted: a restart from the last committed checkpoint would meet the same "
            f"{kinds} again; fix the program, then run it again to resume")


def causes(failure: BaseException) -> list[BaseException]:
    """Each failed rank's exception, where the ranks sent them (a ``WorkerGroupError``'s);
    what :func:`recurring` reads."""
    return list(failure.worker_failures.values()) if isinstance(failure, WorkerGroupError) else []
