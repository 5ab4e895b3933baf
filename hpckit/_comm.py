"""MPI: the world, its topology, and collective steps that fail on every rank together."""

from __future__ import annotations

import pickle
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from hpckit.errors import HpckitError

T = TypeVar("T")


def world() -> Any:
    """MPI.COMM_WORLD, importing mpi4py (and so initialising MPI) only when first needed."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


@dataclass(frozen=True)
class Topology:
    world_rank: int
    world_size: int
    local_rank: int
    local_size: int
    node_rank: int
    num_nodes: int
    hostname: str


def discover(comm: Any) -> tuple[Topology, Any]:
    """This rank's place in the job, and a communicator of the ranks on its node."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    leaders = comm.Split(0 if local.rank == 0 else MPI.UNDEFINED, comm.rank)
    node = (leaders.rank, leaders.size) if local.rank == 0 else None
    if leaders != MPI.COMM_NULL:
        leaders.Free()
    node_rank, num_nodes = local.bcast(node, root=0)
    return Topology(comm.rank, comm.size, local.rank, local.size, node_rank, num_nodes,
                    socket.gethostname()), local


def wait_for_all(comm: Any, first: float = 0.0002, longest: float = 0.005) -> None:
    """A barrier that sleeps while it waits.

    MPI implementations busy-poll inside blocking collectives; ranks waiting there for rank 0
    to finish writing a checkpoint would take the CPU that the copy and its hash need.
    """
    request = comm.Ibarrier()
    delay = first
    while not request.Test():
        time.sleep(delay)
        delay = min(delay * 2, longest)


@dataclass(frozen=True)
class RankFailure:
    """One rank's exception, in a form that crosses MPI whatever the exception was."""

    rank: int
    error: str
    traceback: str
    exception: bytes | None

    @classmethod
    def capture(cls, rank: int, exc: BaseException) -> RankFailure:
        try:
            pickled: bytes | None = pickle.dumps(exc)
        except Exception:
            pickled = None
        text = "".join(traceback.format_exception(exc))
        return cls(rank, f"{type(exc).__name__}: {exc}", text, pickled)

    def original(self) -> BaseException | None:
        if self.exception is None:
            return None
        try:
            return pickle.loads(self.exception)
        except Exception:
            return None


def describe(failures: list[RankFailure], what: str) -> str:
    """One message for failures on several ranks: which ranks, and each traceback once."""
    ranks = ", ".join(str(f.rank) for f in failures)
    seen: dict[str, list[int]] = {}
    for f in failures:
        seen.setdefault(f.traceback, []).append(f.rank)
    details = "\n".join(f"--- rank {', '.join(map(str, rs))} ---\n{tb.rstrip()}" for tb, rs in seen.items())
    return f"{what} failed on rank {ranks}: {failures[0].error}\n{details}"


def raise_failures(failures: list[RankFailure], what: str, kind: type[HpckitError]) -> None:
    """Raise on this rank the one error that every rank raises for these failures.

    When exactly one kind of hpckit error caused it, that error is re-raised as it was, so
    callers can catch e.g. ConfigError the same on every rank.
    """
    if not failures:
        return
    error = _failure_error(failures, what, kind)
    error._hpckit_collective = True  # type: ignore[attr-defined]
    raise error


def _failure_error(failures: list[RankFailure], what: str, kind: type[HpckitError]) -> BaseException:
    originals = [f.original() for f in failures]
    first = originals[0]
    if (isinstance(first, HpckitError) and len({f.error for f in failures}) == 1
            and all(type(o) is type(first) for o in originals)):
        return first
    return kind(describe(failures, what))


def attempt(rank: int, fn: Callable[[], T]) -> tuple[T | None, RankFailure | None]:
    try:
        return fn(), None
    except Exception as exc:
        return None, RankFailure.capture(rank, exc)


def on_root(comm: Any, fn: Callable[[], T], what: str,
            kind: type[HpckitError] = HpckitError) -> T:
    """Run ``fn`` on rank 0 and give its result to every rank, or its error to every rank."""
    outcome = attempt(0, fn) if comm.rank == 0 else None
    value, failure = comm.bcast(outcome, root=0)
    raise_failures([failure] if failure else [], what, kind)
    return value


def everywhere(comm: Any, fn: Callable[[], T], what: str,
               kind: type[HpckitError] = HpckitError) -> list[T]:
    """Run ``fn`` on every rank; all results to every rank, or one error raised on every rank."""
    outcomes = comm.allgather(attempt(comm.rank, fn))
    raise_failures([f for _, f in outcomes if f], what, kind)
    return [v for v, _ in outcomes]
