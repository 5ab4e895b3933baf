"""This rank's asynchronous checkpoints: persisted one after another on a background thread,
oldest first, until the training thread learns at a collective point that every rank has
finished one and rank 0 committed it. The background thread touches MPI only for a cached
checkpoint's partner copy, on a communicator of its own (``run.levels``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass

from hpckit.errors import ProtocolError
from hpckit.run.mpi.comm import RankFailure
from hpckit.run.writing.plan import Finished, Persisted


@dataclass(frozen=True)
class InFlight:
    directory: str
    future: Future[Persisted]


class Background:
    """The persists this rank has started and not yet seen committed."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: deque[InFlight] = deque()

    def __len__(self) -> int:
        return len(self._in_flight)

    @property
    def directories(self) -> list[str]:
        return [f.directory for f in self._in_flight]

    def start(self, directory: str, persist: Callable[[], Persisted]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"hpckit-persist-{self.rank}")
        self._in_flight.append(InFlight(directory, self._pool.submit(persist)))

    def finished(self) -> tuple[Finished, ...]:
        """The in-flight checkpoints already finished, oldest first, up to the first that
        is still running (commits happen in order)."""
        done = []
        for flight in self._in_flight:
            if not flight.future.done():
                break
            error = flight.future.exception()
            done.append(Finished(flight.directory, None, RankFailure.capture(self.rank, error))
                        if error is not None else Finished(flight.directory, flight.future.result()))
        return tuple(done)

    def wait(self, keep: int = 0) -> None:
        """Until at most ``keep`` of them are still running."""
        running = [f.future for f in self._in_flight]
        wait_for(running[:max(0, len(running) - keep)])

    def forget(self, committed: tuple[str, ...]) -> None:
        """Drop the checkpoints the ranks just committed (always the oldest)."""
        for directory in committed:
            oldest = self._in_flight.popleft() if self._in_flight else None
            if oldest is None or oldest.directory != directory:
                raise ProtocolError(
                    f"rank {self.rank}: rank 0 committed {directory} while this rank's oldest "
                    f"checkpoint in flight is {oldest.directory if oldest else 'none'}; please "
                    "report this to hpckit's authors")

    def close(self, wait: bool = True) -> None:
        """At the end of the attempt: what was not committed is abandoned, after any file
        operation under way ends unless not ``wait`` (the next attempt removes what it left)."""
        for flight in self._in_flight:
            flight.future.cancel()
        self._in_flight.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None
