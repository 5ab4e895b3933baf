"""This rank's checkpoints in flight: persisted one after another on a background thread,
oldest first, until the training thread learns at a collective point that every rank has
finished one and rank 0 committed it. :class:`InFlight` is the one owner of that set on a
rank: rank 0's coordinator keeps only the order in which the reports are written, and the
levels ask it where a committed checkpoint lies. The background thread touches MPI only for
a cached checkpoint's partner copy, on a communicator of its own (``run.levels``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpckit.background import IDLE, Worker
from hpckit.errors import ProtocolError
from hpckit.run.mpi.comm import RankFailure
from hpckit.run.writing.plan import Finished, NodeRecords, Persisted, Plan
from hpckit.storage.location import Location

if TYPE_CHECKING:
    from hpckit.run.writing.staging import Taken


@dataclass(frozen=True)
class Flight:
    """One checkpoint in flight: its directory, where it lies once committed (the experiment,
    or this node's cache), the background work's future, and what it took of a handed
    directory (released once it committed, put back if it never does)."""

    directory: str
    committed_at: Location
    future: Future[Persisted]
    plan: Plan | None = None  # where the node leaders write its records (``Plan.by_nodes``)
    taken: Taken | None = None


class InFlight:
    """The checkpoints this rank has started and not yet seen committed."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._worker = Worker(f"hpckit-persist-{rank}", IDLE)
        self._releases = Worker(f"hpckit-release-{rank}", IDLE)  # what commits made the user's to free
        self._flights: deque[Flight] = deque()
        # As a node's leader: the parts of records it wrote of its flights, by directory.
        self.parts: dict[str, NodeRecords] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def start(self, directory: str, committed_at: Location, work: Callable[[], Persisted],
              plan: Plan | None = None, taken: Taken | None = None) -> None:
        """``plan``: the checkpoint's, where the node leaders write its records; ``taken``:
        what it took of a handed directory."""
        by_nodes = plan if plan is not None and plan.by_nodes else None
        self._flights.append(Flight(directory, committed_at, self._worker.submit(work), by_nodes,
                                    taken))

    def by_nodes(self) -> list[tuple[Flight, Plan]]:
        """The checkpoints in flight whose records the node leaders write, with their plans."""
        return [(f, f.plan) for f in self._flights if f.plan is not None]

    def finished(self) -> tuple[Finished, ...]:
        """The checkpoints whose work has ended, oldest first, up to the first that is still
        running (commits happen in order)."""
        done = []
        for flight in self._flights:
            if not flight.future.done():
                break
            error = flight.future.exception()
            done.append(Finished(flight.directory, None, RankFailure.capture(self.rank, error))
                        if error is not None else Finished(flight.directory, flight.future.result()))
        return tuple(done)

    def wait(self, keep: int = 0) -> None:
        """Until at most ``keep`` of them are still running."""
        running = [f.future for f in self._flights]
        wait_for(running[:max(0, len(running) - keep)])

    def drop_committed(self, committed: tuple[str, ...]) -> Location | None:
        """Drop the checkpoints the ranks just committed (always the oldest); where the newest
        of them lies, if any."""
        newest = None
        for directory in committed:
            oldest = self._flights.popleft() if self._flights else None
            if oldest is None or oldest.directory != directory:
                raise ProtocolError(
                    f"rank {self.rank}: rank 0 committed {directory} while this rank's oldest "
                    f"checkpoint in flight is {oldest.directory if oldest else 'none'}")
            newest = oldest.committed_at
            self.parts.pop(directory, None)
            if oldest.taken is not None:
                self._releases.submit(oldest.taken.committed)
        return newest

    def close(self, wait: bool = True) -> None:
        """At the end of the attempt: what was not committed is abandoned, after any file
        operation under way ends unless not ``wait``, and the files its hand-overs moved go
        back where they were, newest first (so that where a name was handed twice, the
        newer file stays)."""
        for flight in self._flights:
            flight.future.cancel()
        abandoned = list(self._flights)
        self._flights.clear()
        self.parts.clear()
        self._worker.stop(wait=wait, cancel=True)
        self._releases.stop(wait=True)
        for flight in reversed(abandoned):
            if flight.taken is not None:
                flight.taken.abandoned(f"checkpoint {flight.directory} did not commit")


def done_now(work: Callable[[], Persisted]) -> Callable[[], Persisted]:
    """``work`` done now, on this thread; its outcome handed to the background as if there."""
    try:
        result = work()
    except Exception as exc:  # noqa: BLE001  (raised again where the background's would be)
        failure = exc

        def again() -> Persisted:
            raise failure

        return again
    return lambda: result
