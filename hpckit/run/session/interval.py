"""``get_context().should_checkpoint()``: how often to checkpoint, by Young and Daly.

A checkpoint that blocks training for C seconds, on a job whose mean time between failures
is M, costs the least (checkpoint time plus work lost to failures) when taken every
τ = √(2·C·M) seconds (Young 1974; Daly 2006 adds terms that matter only when C is a large
part of M). hpckit measures C on each checkpointed ``report()`` (the time it blocked: the
hand-over for an asynchronous one), takes the median of the last few, and M from
``CheckpointConfig(mtbf_s=...)``. Expected work lost per failure is about τ/2 + C.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from hpckit.errors import HpckitError
from hpckit.logs import log
from hpckit.run.commit.planning import check_agreed
from hpckit.run.ending import stop
from hpckit.run.mpi.comm import all_reduce
from hpckit.run.mpi.waiting import quiet_everywhere

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

MEASURED = 5  # blocking times the median is taken over


def optimal_interval(cost_s: float, mtbf_s: float) -> float:
    """Young/Daly's interval in seconds: √(2·C·M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


class CheckpointClock:
    """One rank's record of its checkpoints' blocking times and of its last commit."""

    def __init__(self, mtbf_s: float) -> None:
        self.mtbf_s = mtbf_s
        self.committed_at = time.monotonic()
        self.costs: deque[float] = deque(maxlen=MEASURED)
        self._said: float | None = None

    def reported(self, blocked_s: float | None) -> None:
        """A report returned: it blocked for ``blocked_s`` with a checkpoint (None without).
        The interval counts from there, not from the commit of an asynchronous one, which
        comes later."""
        if blocked_s is not None:
            self.costs.append(blocked_s)
            self.committed_at = time.monotonic()

    def due(self) -> tuple[bool, float | None]:
        """Whether the interval has passed since the last commit, and the interval (None
        until a checkpoint was measured: then it is due, to measure one)."""
        if not self.costs:
            return True, None
        interval = optimal_interval(statistics.median(self.costs), self.mtbf_s)
        return time.monotonic() - self.committed_at >= interval, interval

    def say(self, interval: float) -> None:
        """Log the interval when it is first known and when it moves by a quarter."""
        if self._said is not None and abs(interval - self._said) <= 0.25 * self._said:
            return
        self._said = interval
        cost = statistics.median(self.costs)
        log.info("checkpoint interval %.0f s (Young/Daly: blocking cost %.2f s, "
                 "CheckpointConfig(mtbf_s=%.0f)); expected work lost per failure about %.0f s",
                 interval, cost, self.mtbf_s, interval / 2 + cost)


def agreed_due(comm: Comm, clock: CheckpointClock, stopping: Callable[[], bool]) -> bool:
    """``should_checkpoint()``: True when Young/Daly's interval has passed since the last
    checkpointed report (by rank 0's clock, so every rank gets the same answer), when no
    checkpoint has been measured yet, or when a stop was requested on any rank. Collective:
    each rank sends whether it heard a stop; rank 0 decides."""
    def decide(heard: list[bool]) -> bool:
        check_agreed(heard, bool, "get_context().should_checkpoint()")
        due, interval = clock.due()
        if interval is not None:
            clock.say(interval)
        return due or any(heard)

    quiet_everywhere(comm, -1, False)  # as report() starts: a rank in report() meets it here
    return all_reduce(comm, "get_context().should_checkpoint()",
                      lambda: stop.received() is not None or stopping(), decide, HpckitError)
