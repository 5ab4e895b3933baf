"""The values of the commit protocol, tested without MPI: what each rank announces, what it
persisted, and the plan rank 0 sends every rank (rank 0 makes it in
:mod:`~hpckit.run.commit.planning`, which also assigns the writers and merges what they
wrote); and which files of a checkpoint a rank writes, told in as few bytes as the ranks
need.

Each name a rank hands is written by that rank, unless several ranks hand the same name: the
lowest of them writes it and the others hash theirs, for comparison. So the plan carries only
the names several ranks hand, with their writers (``Plan.shared``), and every rank derives its
own part from the names it handed itself (:func:`own_part`): the plan is the same few bytes at
any rank count. (A checkpoint for the node-local caches also carries every rank's names: a
partner node receives them.)

A rank that hands the same names and sizes as the last time it handed any sends, instead of
the list, the number of the report that sent it (:class:`SentFiles`), and rank 0, which
remembers the lists (``planning.HandedFiles``), reuses the last assignment when no list changed:
in the steady state, no list of names crosses the network, rank 0 assigns nothing, and the
ranks' announcements are alike, so that each node's leader sends rank 0 one of them for all
its ranks (``run.mpi.comm.gather_by_nodes``).
"""

from __future__ import annotations

import marshal
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from enum import Enum
from itertools import groupby
from typing import Any, NamedTuple, TypeVar

import xxhash

from hpckit.errors import ProtocolError
from hpckit.experiment.manifest import CACHE, STORAGE, FileRecord
from hpckit.experiment.records import Part, part_name
from hpckit.run.mpi.comm import RankFailure

# REPORT: a report() call; RETURNED: the training function returned; DRAIN: every rank waited for
# its background checkpoints (the in-flight limit was reached, or a stop was agreed).
REPORT, RETURNED, DRAIN = "report", "returned", "drain"


# What the ranks send rank 0 at every step are named tuples, not dataclasses: rank 0 unpickles
# one from every rank, and at 10,000 ranks a dataclass's reconstruction costs it more than the
# rest of a commit. Each pickles as a plain tuple (``__reduce__``) and is rebuilt without
# running Python code per field. A rank's file records, the most numerous values, cross as
# one ``marshal`` string of plain tuples, which Python reads back several times faster than
# the same tuples pickled (every rank runs the same interpreter, which marshal needs).


class Persisted(NamedTuple):
    """What one rank persisted of one checkpoint: its file records; for a checkpoint
    written in place, the names it found in the directory; for a cached one, the partner
    copies this rank received, as (name, checksum) pairs."""

    records: list[FileRecord]
    listed: tuple[str, ...] = ()
    copies: tuple[tuple[str, str], ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return _persisted, (marshal.dumps([tuple(r) for r in self.records]), self.listed,
                            self.copies)


def _persisted(records: bytes, listed: tuple[str, ...], copies: tuple[tuple[str, str], ...]
               ) -> Persisted:
    return tuple.__new__(Persisted, (list(map(FileRecord._make, marshal.loads(records))),
                                     listed, copies))


class NodeRecords(NamedTuple):
    """What a node's leader sends rank 0 of a checkpoint whose records the leaders write
    (``Plan.by_nodes``, ``writer.node_part``)."""

    leader: int  # the node's first rank, which wrote the part (``records.part_name``)
    ranks: int  # the node's, whose records the part holds
    checksum: str  # the part's
    records: int  # how many it holds
    size: int  # the bytes of the files they name
    shared: list[FileRecord]  # the records of names several ranks hand, writers' and others'

    def part(self, directory: str) -> Part:
        """The part, as the index of checkpoint ``directory`` names it."""
        return Part(part_name(directory, self.leader), self.checksum, self.records)

    def __reduce__(self) -> tuple[Any, ...]:
        return _node_records, (tuple(self),)


def _node_records(values: tuple[Any, ...]) -> NodeRecords:
    return tuple.__new__(NodeRecords, values)


class Finished(NamedTuple):
    """One background checkpoint that this rank has finished persisting, or failed to. Where
    the node leaders write its records (``Plan.by_nodes``), the leader sends rank 0 its
    node's ``node`` records, once its node's ranks have all finished, and no rank's own
    (``writer.finished_by_node``)."""

    directory: str
    persisted: Persisted | None = None
    failure: RankFailure | None = None
    node: NodeRecords | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return _finished, (tuple(self),)


def _finished(values: tuple[Any, ...]) -> Finished:
    return tuple.__new__(Finished, values)


class Announcement(NamedTuple):
    """What one rank tells rank 0 at a report (or at the end of the training function)."""

    kind: str
    number: int  # of report() calls so far
    files: list[tuple[str, int]] | None = None
    failure: RankFailure | None = None
    stop: str | None = None
    in_place: bool = False
    finished: tuple[Finished, ...] = ()
    asynchronous: bool = False
    dir_name: str | None = None
    metrics: dict[str, Any] | None = None  # this rank's, sent only for UserCallbacks
    later: tuple[str, ...] = ()  # in place: files this rank's saves are still writing
    uploading: bool = False  # in place, by this rank's checkpoint_upload_fn
    same_files_as: int | None = None  # files: the same list as this rank sent at that report
    keeps: bool = False  # this rank keeps a resume state (random streams, loader positions)

    def __reduce__(self) -> tuple[Any, ...]:
        return _announcement, (tuple(self),)

    @property
    def hands(self) -> bool:
        """This rank hands a directory of files (listed, or the same as last time)."""
        return self.files is not None or self.same_files_as is not None

    @property
    def quiet(self) -> bool:
        """A report with metrics only and nothing else to tell rank 0."""
        return (self.kind == REPORT and not self.hands and self.failure is None
                and self.stop is None and not self.in_place and not self.finished
                and self.dir_name is None and self.metrics is None and not self.later
                and not self.uploading)


def _announcement(values: tuple[Any, ...]) -> Announcement:
    return tuple.__new__(Announcement, values)


class Placement(Enum):
    """How a checkpoint's files reach its directory: one of three, never a mix (a report
    whose ranks mix them is refused in ``planning``)."""

    HANDED = "handed"  # the ranks handed directories of their own: hpckit writes the files
    IN_PLACE = "in place"  # the ranks wrote them into get_checkpoint_dir(): hpckit hashes them
    UPLOADED = "uploaded"  # checkpoint_upload_fn put them there: hpckit hashes what it finds

    @property
    def found(self) -> bool:
        """The files are found in a directory the ranks share, not written from the ones
        they handed: any rank may hash any of them, and each rank lists what it sees."""
        return self is not Placement.HANDED


@dataclass(frozen=True)
class Plan:
    """Rank 0's decision for one report, sent to every rank: the checkpoint to write (if any),
    and the background checkpoints committed on the way. ``shared``: the names several ranks
    hand, with the rank that writes each; ``writes`` and ``hashes``, by rank, are filled in by
    each rank for itself (:func:`own_part`), by rank 0 for every rank only for the
    node-local caches. A checkpoint's plan answers three questions apart, each in one field
    whose values exclude one another: how its files arrive (``placement``), where they go
    (``level``) and when (``asynchronous``: in the background). ``by_nodes``: its records are
    many, and merged by the node leaders (``writer.node_part``)."""

    step: int
    stop: str | None = None
    directory: str | None = None
    writes: dict[int, list[str]] = field(default_factory=dict)
    hashes: dict[int, list[str]] = field(default_factory=dict)
    shared: dict[str, int] = field(default_factory=dict)
    placement: Placement = Placement.HANDED
    asynchronous: bool = False
    index: int | None = None
    later: dict[int, tuple[str, ...]] = field(default_factory=dict)  # by rank: its own to hash
    committed: tuple[str, ...] = ()
    committing: tuple[str, ...] = ()  # finished by every rank; rank 0 writes their commits
    criterion_met: bool = False  # RunConfig(stop=...) was met: the run ends after this report
    level: str = STORAGE  # or CACHE: the node-local caches only (CheckpointConfig(cache_dir))
    kept: tuple[str, ...] | None = None  # with caches: every checkpoint they keep
    placed_by: int | None = None  # found: the one rank that handed it, where only one did
    by_nodes: bool = False  # its records are merged and written by the node leaders
    refused: tuple[RankFailure, ...] = ()  # ranks failed to prepare: raised once committed is known
    states: bool = False  # ranks keep resume states: each node's leader writes its node's

    def __getstate__(self) -> dict[str, Any]:
        """The fields that differ from their defaults: rank 0 sends the plan to every rank
        at every step, and most fields keep their defaults at most steps."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in _DEFAULTS or getattr(self, f.name) != _DEFAULTS[f.name]()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, default in _DEFAULTS.items():
            object.__setattr__(self, name, state[name] if name in state else default())
        object.__setattr__(self, "step", state["step"])

    def checkpoint(self) -> tuple[str, int]:
        """The directory and index of the checkpoint this plan writes."""
        if self.directory is None or self.index is None:
            raise ProtocolError(f"the plan of step {self.step} writes no checkpoint, yet a rank "
                                "went on to write one")
        return self.directory, self.index


# Each field's default, made afresh (a dict is never shared between plans).
def _default_of(f: Field[Any]) -> Callable[[], Any]:
    if f.default_factory is not MISSING:
        return f.default_factory
    value = f.default
    return lambda: value


_DEFAULTS = {f.name: _default_of(f) for f in fields(Plan) if f.name != "step"}


T = TypeVar("T")
Runs = list[tuple[Announcement, range]]


def runs(values: Sequence[T]) -> list[tuple[T, range]]:
    """``values`` as runs of equal neighbours, each with its ranks. Rank 0 places a node's
    alike announcements as one object (``leaders.place``), and in the steady state the nodes'
    are alike too, so its checks walk a run or two a node at most, in rank order, where they
    would walk every rank."""
    found: list[tuple[T, range]] = []
    start = 0
    for value, alike in groupby(values):
        end = start + len(list(alike))
        found.append((value, range(start, end)))
        start = end
    return found


def in_background(stop: str | None, asked: bool) -> bool:
    """Whether a checkpoint is persisted in the background: where asked, and never once a stop
    is agreed (the run ends as soon as that checkpoint is committed). The one place that
    decides it, for every level."""
    return asked and stop is None


Files = list[tuple[str, int]]  # (name, size) of each file a rank hands


def part_of(shared: dict[str, int], rank: int, files: Files) -> tuple[list[str], list[str]]:
    """The names ``rank`` writes and those it only hashes, of the ``files`` it handed."""
    writes = [name for name, _ in files if shared.get(name, rank) == rank]
    return writes, [name for name, _ in files if shared.get(name, rank) != rank]


def own_part(plan: Plan, rank: int, files: Files | None) -> Plan:
    """The plan as this rank acts on it: its own writes and hashes filled in from the names it
    handed (a plan for the caches came with every rank's)."""
    if plan.directory is None or plan.level == CACHE or not files:
        return plan
    writes, hashes = part_of(plan.shared, rank, files)
    return replace(plan, writes={rank: writes}, hashes={rank: hashes} if hashes else {})


def digest(files: Files) -> int:
    return xxhash.xxh3_64_intdigest(repr(files).encode())


class SentFiles:
    """A rank's side: the digest of the files it last told rank 0 of, and at which report."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.sent_at: int | None = None

    def compact(self, files: Files | None, report: int) -> tuple[Files | None, int | None]:
        """What to announce at ``report``: the list where it changed, else (None, the number
        of the report that sent it)."""
        if files is None:
            return None, None
        value = digest(files)
        if value == self.last:
            return None, self.sent_at
        self.last, self.sent_at = value, report
        return files, None
