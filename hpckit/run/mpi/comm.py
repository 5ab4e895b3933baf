"""MPI: the world, and collective steps that fail on every rank together.

Every collective hpckit runs goes through :func:`all_reduce`, :func:`on_root` or
:func:`everywhere`: each wraps every rank's step, gathers the outcomes and raises one error
on every rank, so no rank raises alone while the others wait.

On several nodes a step's values gather to rank 0 through the node leaders, one contribution
per node (:func:`gather_by_nodes`). Rank 0 unpickles whatever every rank sends it at a step,
and at thousands of ranks that was most of its work on a report. Gathered on its node first,
the node's leader sends rank 0 one pickle for the node, which holds each distinct value once
and, where they differ, which rank sent which: in the steady state every rank of a node
announces the same thing (the same files as at an earlier report, the same mode, no
failure), so rank 0 reads one value per node and hands it to each of the node's ranks
(``benchmarks/scale_model.py``). Values that differ (file records) still cross once per
rank, in the node's one pickle. The leaders do that work in parallel, one node each. With
one node there is nothing to gain, and the step is the world's own gather
(:func:`~hpckit.run.mpi.waiting.gather_to_root`).

Ranks of a node whose values are alike receive one object between them: the values gathered
are read, never changed.

Ctrl-C: every wait here watches the world for rank 0's word, as the world's gather does.
"""

from __future__ import annotations

import pickle
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

from hpckit import logs
from hpckit.errors import HpckitError, ProtocolError
from hpckit.run.mpi import progress
from hpckit.run.mpi.group import Group
from hpckit.run.mpi.waiting import (
    collection_paused,
    from_root,
    gather_bytes,
    gather_to_root,
    root_work,
    share,
    wait_for_all,
)

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

Ranks: TypeAlias = "Comm | Group"  # a Group's steps gather through its node leaders

T = TypeVar("T")
R = TypeVar("R")
K = TypeVar("K")
C = TypeVar("C")

# Errors raised on every rank together by raise_failures: such an error ends the run on each
# rank as it is, while an error of one rank alone must abort the job (see run.ending.exit).
_raised_together: weakref.WeakSet[BaseException] = weakref.WeakSet()
_failed_ranks: weakref.WeakKeyDictionary[BaseException, list[RankFailure]] = \
    weakref.WeakKeyDictionary()
MESSAGES_SHOWN = 3  # distinct messages of hpckit errors in one failure, beyond the first


def world() -> Comm:
    """MPI.COMM_WORLD, importing mpi4py (and so initialising MPI) only when first needed."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def duplicate(comm: Comm) -> Comm:
    """A duplicate of ``comm`` (collective), made once every rank of it has come.

    MPI's Dup is a blocking collective: a rank that comes first busy-polls in it until the
    last one comes, and where ranks come seconds apart (each importing torch and the user's
    script, more ranks than free cores) it takes the CPU from the very ranks it waits for. The
    sleeping barrier before it (:func:`~hpckit.run.mpi.waiting.wait_for_all`) leaves them the
    CPU, and Ctrl-C reaches the rank that waits there."""
    wait_for_all(comm)
    return comm.Dup()


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
            original = pickle.loads(self.exception)
        except Exception:
            return None
        return original if isinstance(original, BaseException) else None


def describe(failures: list[RankFailure], what: str) -> str:
    """One message for failures on several ranks: which ranks, and each traceback once.

    hpckit's own errors say what is wrong and the fix: they are given as their messages
    (each distinct one once), without hpckit's frames, unless HPCKIT_LOG_LEVEL=DEBUG."""
    ranks = ", ".join(str(f.rank) for f in failures)
    if not logs.debugging() and all(isinstance(f.original(), HpckitError) for f in failures):
        others = list(dict.fromkeys(f.error for f in failures[1:] if f.error != failures[0].error))
        shown = "".join(f"\n  {error}" for error in others[:MESSAGES_SHOWN])
        more = len(others) - MESSAGES_SHOWN
        return (f"{what} failed on rank {ranks}: {failures[0].error}{shown}"
                + (f"\n  ... and {more} more" if more > 0 else ""))
    seen: dict[str, list[int]] = {}
    for f in failures:
        seen.setdefault(f.traceback, []).append(f.rank)
    details = "\n".join(f"--- rank {', '.join(map(str, rs))} ---\n{tb.rstrip()}" for tb, rs in seen.items())
    return f"{what} failed on rank {ranks}: {failures[0].error}\n{details}"


def raise_failures(failures: list[RankFailure], what: str, kind: type[HpckitError],
                   wrap: bool = False) -> None:
    """Raise on this rank the one error that every rank raises for these failures.

    When exactly one kind of hpckit error caused it, that error is re-raised as it was, so
    callers can catch e.g. ConfigError the same on every rank; with ``wrap`` it is always a
    ``kind`` that names the failed ranks.
    """
    if not failures:
        return
    error = kind(describe(failures, what)) if wrap else _failure_error(failures, what, kind)
    _raised_together.add(error)
    _failed_ranks[error] = failures
    raise error


def failed_ranks(error: BaseException) -> dict[int, BaseException]:
    """For an error every rank raised together: each failed rank and what it raised there
    (its original exception where that could be sent, else ``error``)."""
    try:
        failures = _failed_ranks.get(error, [])
    except TypeError:  # a built-in exception (no weak reference): not one of hpckit's
        return {}
    return {f.rank: f.original() or error for f in failures}


def raised_together(error: BaseException) -> bool:
    """Whether every rank raised ``error`` together (through :func:`raise_failures`)."""
    return error in _raised_together


def _failure_error(failures: list[RankFailure], what: str, kind: type[HpckitError]) -> BaseException:
    originals = [f.original() for f in failures]
    first = originals[0]
    if (isinstance(first, HpckitError) and len({f.error for f in failures}) == 1
            and all(type(o) is type(first) for o in originals)):
        return first
    return kind(describe(failures, what))


def captured(rank: int, fn: Callable[[], T]) -> tuple[T | None, RankFailure | None]:
    try:
        return fn(), None
    except Exception as exc:
        return None, RankFailure.capture(rank, exc)


def on_root(comm: Comm, fn: Callable[[], tuple[K, T]], what: str,
            kind: type[HpckitError] = HpckitError) -> tuple[K | None, T]:
    """Run ``fn`` on rank 0, which keeps the first part of its result; every rank receives
    the second part, or the error raised on every rank."""
    kept: K | None = None
    outcome = None
    if comm.rank == 0:
        result, failure = root_work(comm, lambda: captured(0, fn))
        kept, shared = result if result is not None else (None, None)
        outcome = (shared, failure)
    value, failure = from_root(comm, outcome)
    raise_failures([failure] if failure else [], what, kind)
    return kept, value


def all_reduce(ranks: Ranks, what: str, local: Callable[[], T], reduce: Callable[[list[T]], R],
               kind: type[HpckitError] = HpckitError, undo: Callable[[], None] | None = None,
               prepare: Prepare | None = None) -> R:
    """One collective step, as torch DCP's ``_DistWrapper.all_reduce``: every rank runs
    ``local``; rank 0 runs ``reduce`` over every rank's value; every rank receives its result.
    A failure anywhere is raised on every rank as one error naming the failed ranks.

    Every rank waits for the others in Python, sleeping (:mod:`hpckit.run.mpi.waiting`): Ctrl-C
    reaches it at once, and it leaves the CPU to rank 0's ``reduce`` (a checkpoint's copy and
    hash). ``undo`` runs on rank 0 when a rank's ``local`` failed, and the error is then
    always a ``kind`` naming the failed ranks (``reduce`` raises and undoes its own failures).
    Given a :class:`~hpckit.run.mpi.group.Group`, the values reach rank 0 through the node
    leaders, each of which may ``prepare`` its node's (value, failure) pairs first.
    """
    comm = ranks.world if isinstance(ranks, Group) else ranks
    own = captured(comm.rank, local)
    outcome = None
    if comm.rank == 0:
        outcome = root_work(comm, lambda: _reduce_gathered(ranks, own, reduce, undo, prepare))
    else:
        _gathered(ranks, own, prepare)
    result, failures, wrap = from_root(comm, outcome)
    raise_failures(failures, what, kind, wrap)
    return cast(R, result)


def all_reduce_by_nodes(group: Group, what: str, local: Callable[[], T],
                        by_node: Callable[[tuple[int, ...], list[T]], C],
                        reduce: Callable[[list[C]], R], kind: type[HpckitError] = HpckitError,
                        undo: Callable[[], None] | None = None) -> R:
    """:func:`all_reduce` where each node's leader condenses its ranks' values first
    (``by_node(members, values)``: what rank 0 needs of the node), so that rank 0 reduces one
    value per node. A rank's failure, or the leader's in ``by_node``, fails the step as in
    :func:`all_reduce`."""
    comm = group.world
    own = captured(comm.rank, local)
    condense = partial(_node_step, by_node, comm.rank)
    outcome = None
    if comm.rank == 0:
        outcome = root_work(comm, lambda: _reduce_nodes(
            condensed_by_nodes(group, own, condense) or [], reduce, undo))
    else:
        condensed_by_nodes(group, own, condense)
    result, failures, wrap = from_root(comm, outcome)
    raise_failures(failures, what, kind, wrap)
    return cast(R, result)


def _node_step(by_node: Callable[[tuple[int, ...], list[T]], C], leader: int,
               members: tuple[int, ...], items: list[tuple[T | None, RankFailure | None]]
               ) -> tuple[C | None, list[RankFailure]]:
    failures = [f for _, f in items if f]
    if failures:
        return None, failures
    value, failure = captured(leader, lambda: by_node(members, [cast(T, v) for v, _ in items]))
    return value, [failure] if failure else []


def _reduce_nodes(gathered: list[tuple[C | None, list[RankFailure]]],
                  reduce: Callable[[list[C]], R], undo: Callable[[], None] | None
                  ) -> tuple[R | None, list[RankFailure], bool]:
    failures = [f for _, node in gathered for f in node]
    if failures:
        return _undone(failures, undo)
    return _reduced(lambda: reduce([cast(C, v) for v, _ in gathered]))


def _gathered(ranks: Ranks, value: T, prepare: Prepare | None = None) -> list[T] | None:
    if isinstance(ranks, Group):
        return gather_by_nodes(ranks, value, prepare)
    return gather_to_root(ranks, value)


def _reduce_gathered(ranks: Ranks, own: tuple[T | None, RankFailure | None],
                     reduce: Callable[[list[T]], R], undo: Callable[[], None] | None,
                     prepare: Prepare | None) -> tuple[R | None, list[RankFailure], bool]:
    gathered = _gathered(ranks, own, prepare) or []
    failures = [f for _, f in gathered if f]
    if failures:
        return _undone(failures, undo)
    return _reduced(lambda: reduce([cast(T, v) for v, _ in gathered]))


def _undone(failures: list[RankFailure], undo: Callable[[], None] | None
            ) -> tuple[None, list[RankFailure], bool]:
    """Ranks failed: rank 0 undoes the step, and the error names them (wrapped, when undone)."""
    if undo is not None:
        undo()
    return None, failures, undo is not None


def _reduced(fn: Callable[[], R]) -> tuple[R | None, list[RankFailure], bool]:
    result, failure = captured(0, fn)
    return result, [failure] if failure else [], False


def everywhere(comm: Comm, fn: Callable[[], T], what: str,
               kind: type[HpckitError] = HpckitError) -> list[T]:
    """Run ``fn`` on every rank; all results to every rank, or one error raised on every rank."""
    outcomes = share(comm, captured(comm.rank, fn))
    raise_failures([f for _, f in outcomes if f], what, kind)
    return cast(list[T], [v for v, _ in outcomes])  # no rank failed: each holds its value


# Background duplicates of attempts that ended badly: their messages may be half exchanged, so
# they are never used again; freeing is collective, so the next attempt's first for_background
# frees them (a sweep's group retried in-process: every rank of it is there). A job whose peer
# died frees none: it ends.
_retired: list[Comm] = []
_live = 0  # duplicates made and not yet freed, retired ones included


def for_background(comm: Comm) -> Comm | None:
    """A duplicate of ``comm`` for a background thread's messages (collective: every rank
    calls it at the same point); None when MPI cannot serve two threads at once. The
    duplicates that earlier attempts retired are freed first."""
    from mpi4py import MPI

    global _live
    while _retired:
        progress.free(_retired.pop(), timeout=0)
        _live -= 1
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return None
    _live += 1
    return duplicate(comm)


def free_background(duplicate: Comm) -> None:
    """Collective, after the last message of an attempt that ended well."""
    global _live
    progress.free(duplicate)
    _live -= 1


def retire_background(duplicate: Comm) -> None:
    """An attempt that ended badly: its duplicate is freed at the next attempt's start."""
    _retired.append(duplicate)


class BackgroundComm:
    """One attempt's duplicate communicator for a background thread's messages, and the
    signal that ends their use: freed together after an attempt that ended well, retired (freed
    at the next attempt's start) after one that did not, since a message under way on another
    thread may still use it then."""

    def __init__(self) -> None:
        self.comm: Comm | None = None
        self.abandoned = threading.Event()  # set: the background waits and copies stop

    def open(self, comm: Comm) -> bool:
        """Make the duplicate of ``comm`` (collective, as :func:`for_background`); whether MPI
        can serve the background thread."""
        self.comm = for_background(comm)
        return self.comm is not None

    def abandon(self) -> None:
        """The attempt ends: what runs in the background stops (its peers may be gone), and a
        duplicate not released is retired."""
        if self.comm is not None and not self.abandoned.is_set():
            retire_background(self.comm)
        self.abandoned.set()

    def release(self) -> None:
        """Collective, after the last background message of an attempt that ended well."""
        if self.comm is not None and not self.abandoned.is_set():
            free_background(self.comm)
            self.comm = None


def live_backgrounds() -> int:
    """Background duplicates this process holds (retired ones included)."""
    return _live


# A node's values: its ranks, each distinct value once, and which of them each rank sent
# (None: they all sent the first).
Contribution = tuple[tuple[int, ...], list[Any], list[int] | None]
# What a leader may do to its node's values before it sends them (``members``, ``values``):
# the same number of values back, in the same order. It must not raise.
Prepare = Callable[[tuple[int, ...], list[Any]], list[Any]]


def gather_by_nodes(group: Group, value: T, prepare: Prepare | None = None) -> list[T] | None:
    """Every rank's ``value`` to rank 0, in world rank order (None on the other ranks): to
    its node's leader, then one contribution per node to rank 0. ``prepare``: what each
    leader does to its node's values first."""
    if group.topology.num_nodes == 1:
        values = gather_to_root(group.world, value)
        return values if values is None or prepare is None else prepare(
            tuple(range(group.size)), values)
    return _through_leaders(group, value, None, prepare)


def condensed_by_nodes(group: Group, value: T, condense: Callable[[tuple[int, ...], list[T]], C]
                       ) -> list[C] | None:
    """Each node's ranks' values, condensed by its leader (``condense(members, values)``, which
    must not raise), to rank 0 in node order (None on the other ranks): rank 0 receives one
    value per node, and never the ranks' own."""
    if group.topology.num_nodes == 1:
        values = gather_to_root(group.world, value)
        return None if values is None else [condense(tuple(range(group.size)), values)]
    return _through_leaders(group, value, condense)


def _through_leaders(group: Group, value: Any, condense: Callable[..., Any] | None,
                     prepare: Prepare | None = None) -> list[Any] | None:
    data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    if group.rank != 0:
        node = gather_bytes(group.node, data, alarms=group.world)
        if group.leaders is not None:
            contribution = _contribution(group.members, _prepared(group.members, node or [],
                                                                  prepare), condense)
            gather_bytes(group.leaders, pickle.dumps(contribution, pickle.HIGHEST_PROTOCOL),
                         alarms=group.world)
        return None
    leaders = group.leaders
    if leaders is None:
        raise ProtocolError("rank 0 does not lead its node (a bug in hpckit: please report it)")
    own, contributions = root_work(group.world, lambda: (
        gather_bytes(group.node, data, alarms=group.world) or [],
        gather_bytes(leaders, b"", alarms=group.world) or []))
    if condense is not None:
        mine = _contribution(group.members, own, condense)  # the leader's work, collector on
        with collection_paused():
            return [mine, *(pickle.loads(item) for item in contributions[1:])]
    prepared = _prepared(group.members, own, prepare)
    with collection_paused():
        return placed(group.size, of_node(group.members, prepared), contributions[1:])


def placed(size: int, own: Contribution, others: Sequence[bytes | memoryview]) -> list[Any]:
    """Rank 0: every rank's value by world rank, from its own node's contribution and each
    other node's, pickled (call it with the collector paused: ``collection_paused``)."""
    values: list[Any] = [None] * size
    place(values, own)
    for item in others:
        place(values, pickle.loads(item))
    return values  # every rank is some node's


def _contribution(members: tuple[int, ...], items: Sequence[bytes | memoryview],
                  condense: Callable[..., Any] | None) -> Any:
    if condense is None:
        return of_node(members, items)
    return condense(members, [pickle.loads(item) for item in items])


def _prepared(members: tuple[int, ...], items: Sequence[bytes | memoryview],
              prepare: Prepare | None) -> Sequence[bytes | memoryview]:
    if prepare is None:
        return items
    values = prepare(members, [pickle.loads(item) for item in items])
    return [pickle.dumps(value, pickle.HIGHEST_PROTOCOL) for value in values]


def of_node(members: tuple[int, ...], items: Sequence[bytes | memoryview]) -> Contribution:
    """A leader's contribution from its node's pickled values (``items``, in ``members``'
    order): each distinct value read once."""
    distinct: dict[bytes, int] = {}
    held = [distinct.setdefault(bytes(item), len(distinct)) for item in items]
    values = [pickle.loads(item) for item in distinct]
    return members, values, None if len(values) == 1 else held


def place(placed: list[Any], contribution: Contribution) -> None:
    """Rank 0: a node's values into ``placed``, by world rank (a count that does not match
    its ranks is raised here, on rank 0, never on a leader that rank 0 waits for)."""
    members, values, held = contribution
    if held is not None and len(held) != len(members):
        raise ProtocolError(f"a node of ranks {members} gathered {len(held)} values (a bug in "
                            "hpckit: please report it)")
    if held is None:
        for rank in members:
            placed[rank] = values[0]
    else:
        for rank, index in zip(members, held, strict=True):
            placed[rank] = values[index]
