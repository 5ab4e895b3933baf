"""Rank 0's commits of background checkpoints, made while the ranks train.

A background checkpoint that every rank has finished used to be committed inside the next
report's collective step: the other ranks waited while rank 0 wrote its metrics line and the
manifest (a few milliseconds on a local disk, a hundred on a loaded Lustre or S3). Now rank 0
hands those writes to the experiment's writer thread and replies at once; the next
collective step tells every rank which commits are written. The writer makes every change of
the experiment in the order it was handed over, so metrics lines and manifests keep the
order of the reports. After a write fails, the later ones are not made: their checkpoints are
discarded, as they would have been had the commit run in the collective.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass

from hpckit import faults
from hpckit.experiment.writer import Writer


@dataclass(frozen=True)
class Job:
    directory: str | None  # the checkpoint it commits; None for a metrics line
    future: Future[None]


class Committer:
    """The background commits handed to the experiment's writer, in report order."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self._jobs: deque[Job] = deque()
        self._failed = False

    @property
    def busy(self) -> bool:
        return any(not job.future.done() for job in self._jobs)

    @property
    def directories(self) -> tuple[str, ...]:
        """The checkpoints handed over and not yet reported as written, oldest first."""
        return tuple(job.directory for job in self._jobs if job.directory is not None)

    def submit(self, directory: str | None, write: Callable[[], None],
               discard: Callable[[], None]) -> None:
        """Run ``write`` after the work given before it; after a failure, ``discard`` instead."""
        self._jobs.append(Job(directory, self._writer.submit(
            lambda: self._run(directory, write, discard))))

    def _run(self, directory: str | None, write: Callable[[], None],
             discard: Callable[[], None]) -> None:
        if self._failed:
            discard()
            return
        if directory is not None:
            faults.reached("committing", 0)
        try:
            write()
        except BaseException:
            self._failed = True
            raise

    def only_lines(self) -> bool:
        """Whether every write handed over is a metrics line and none failed; the lines
        already written are let go (a run of reports without checkpoints, which no
        collective step hears of, must not keep them all)."""
        while (self._jobs and self._jobs[0].directory is None and self._jobs[0].future.done()
               and self._jobs[0].future.exception() is None):
            self._jobs.popleft()
        return not self._failed and all(job.directory is None for job in self._jobs)

    def newly_committed(self) -> tuple[tuple[str, ...], BaseException | None]:
        """The checkpoints committed since the last call, oldest first, and the first failure
        (after which nothing more is committed)."""
        committed: list[str] = []
        while self._jobs and self._jobs[0].future.done():
            job = self._jobs.popleft()
            error = job.future.exception()
            if error is not None:
                self._jobs.clear()
                return tuple(committed), error
            if job.directory is not None:
                committed.append(job.directory)
        return tuple(committed), None

    def wait(self) -> None:
        wait_for([job.future for job in self._jobs])

    def close(self) -> None:
        """At the end of the attempt: the commits handed over are made (or given up)."""
        self.wait()
