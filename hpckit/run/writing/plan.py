"""The pure parts of the commit protocol, tested without MPI: what each rank announces, the
plan rank 0 makes from every announcement (are all ranks at the same report? which rank writes
which file? which background checkpoints has every rank finished?), and the merge of what the
ranks wrote."""

from __future__ import annotations

import marshal
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hpckit.errors import CheckpointError, CommitError, ProtocolError, ReportMismatchError
from hpckit.experiment.manifest import (
    STORAGE,
    FileRecord,
    checkpoint_dirname,
    custom_dirname_problem,
)
from hpckit.run.mpi.comm import RankFailure, raise_failures
from hpckit.run.writing.assignment import HandedFiles

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


@dataclass(frozen=True)
class Settled:
    """One background checkpoint that this rank has finished persisting, or failed to."""

    directory: str
    persisted: Persisted | None = None
    failure: RankFailure | None = None


class Announcement(NamedTuple):
    """What one rank tells rank 0 at a report (or at the end of the training function)."""

    kind: str
    number: int  # of report() calls so far
    files: list[tuple[str, int]] | None = None
    failure: RankFailure | None = None
    stop: str | None = None
    in_place: bool = False
    settled: tuple[Settled, ...] = ()
    asynchronous: bool = False
    dir_name: str | None = None
    metrics: dict[str, Any] | None = None  # this rank's, sent only for UserCallbacks
    later: tuple[str, ...] = ()  # in place: files this rank's saves are still writing
    uploading: bool = False  # in place, by this rank's checkpoint_upload_fn
    same_files: int | None = None  # files: the digest of the list, the same as last time

    def __reduce__(self) -> tuple[Any, ...]:
        return _announcement, (tuple(self),)

    @property
    def hands(self) -> bool:
        """This rank hands a directory of files (listed, or the same as last time)."""
        return self.files is not None or self.same_files is not None

    @property
    def quiet(self) -> bool:
        """A report with metrics only and nothing else to tell rank 0."""
        return (self.kind == REPORT and not self.hands and self.failure is None
                and self.stop is None and not self.in_place and not self.settled
                and self.dir_name is None and self.metrics is None and not self.later
                and not self.uploading)


def _announcement(values: tuple[Any, ...]) -> Announcement:
    return tuple.__new__(Announcement, values)


@dataclass(frozen=True)
class Plan:
    """Rank 0's decision for one report, sent to every rank: the checkpoint to write (if any),
    and the background checkpoints committed on the way. ``shared``: the names several ranks
    hand, with the rank that writes each; ``writes`` and ``hashes``, by rank, are filled in by
    each rank for itself (``assignment.own_part``), by rank 0 for every rank only for the
    node-local caches."""

    step: int
    stop: str | None = None
    directory: str | None = None
    writes: dict[int, list[str]] = field(default_factory=dict)
    hashes: dict[int, list[str]] = field(default_factory=dict)
    shared: dict[str, int] = field(default_factory=dict)
    in_place: bool = False
    asynchronous: bool = False
    index: int | None = None
    later: dict[int, tuple[str, ...]] = field(default_factory=dict)  # by rank: its own to hash
    committed: tuple[str, ...] = ()
    committing: tuple[str, ...] = ()  # finished by every rank; rank 0 writes their commits
    criterion_met: bool = False  # RunConfig(stop=...) was met: the run ends after this report
    level: str = STORAGE  # or CACHE: the node-local caches only (CheckpointConfig(cache_dir))
    kept: tuple[str, ...] | None = None  # with caches: every checkpoint they keep
    uploaded: bool = False  # by checkpoint_upload_fn: every rank meets before it lists the files
    placed_by: int | None = None  # in place: the one rank that handed it, where only one did

    def checkpoint(self) -> tuple[str, int]:
        """The directory and index of the checkpoint this plan writes."""
        if self.directory is None or self.index is None:
            raise ProtocolError(f"the plan of step {self.step} writes no checkpoint, yet a rank "
                                "went on to write one")
        return self.directory, self.index


def make_plan(announcements: list[Announcement], step: int, next_index: int,
              handed_before: HandedFiles | None = None) -> Plan:
    """The plan for this report: a checkpoint directory and its writers when any rank handed
    files, else a metrics-only report. Raises when ranks disagree or one failed to prepare.
    ``handed_before``: rank 0's memory of the files each rank handed last."""
    memory = handed_before or HandedFiles()
    handed = memory.of(announcements)
    check_counts(announcements)
    failures = [a.failure for a in announcements if a.failure]
    if failures:
        raise_failures(failures, "report()", CommitError)
    stop = next((a.stop for a in announcements if a.stop), None)
    in_place = [rank for rank, a in enumerate(announcements) if a.in_place]
    if announcements[0].kind != REPORT or not (handed or in_place):
        return Plan(step, stop)
    uploaded = _uploaded(announcements)
    if in_place and handed:
        raise CheckpointError(
            f"rank {in_place[0]} wrote its checkpoint in place (get_checkpoint_dir()) while rank "
            f"{min(handed)} handed a directory of its own; in one report every rank either writes "
            "into get_checkpoint_dir() or hands its own directory. Write the extra files into "
            "get_checkpoint_dir() too.")
    asked = [a.asynchronous for a in announcements if a.hands or a.in_place]
    asynchronous = in_background(stop, all(asked))
    named = _directory_name(announcements, bool(in_place) and not uploaded)
    directory = named or checkpoint_dirname(next_index)
    later = {rank: a.later for rank, a in enumerate(announcements) if a.later}
    return Plan(step, stop, directory, shared=memory.writers(handed), in_place=bool(in_place),
                asynchronous=asynchronous, index=next_index, later=later, uploaded=uploaded,
                placed_by=in_place[0] if len(in_place) == 1 else None)


def _uploaded(announcements: list[Announcement]) -> bool:
    """Whether checkpoint_upload_fn uploads this checkpoint: then on every rank handing one."""
    uploading = [rank for rank, a in enumerate(announcements) if a.uploading]
    other = [rank for rank, a in enumerate(announcements)
             if (a.hands or a.in_place) and not a.uploading]
    if uploading and other:
        raise CheckpointError(
            f"rank(s) {_ranks(uploading)} passed checkpoint_upload_fn and rank(s) {_ranks(other)} "
            "handed a checkpoint without one; in one report pass it on every rank that hands a "
            "checkpoint (checkpoint=None on a rank with nothing to upload).")
    return bool(uploading)


def in_background(stop: str | None, asked: bool) -> bool:
    """Whether a checkpoint is persisted in the background: where asked, and never once a stop
    is agreed (the run ends as soon as that checkpoint is committed). The one place that
    decides it, for every level."""
    return asked and stop is None


def mixed_modes(announcements: list[Announcement]) -> str | None:
    """Which ranks that hand a checkpoint asked ASYNC and which did not, when they disagree (a
    rank that hands none has nothing to upload, and no say, as in Ray)."""
    handing = [(rank, a.asynchronous) for rank, a in enumerate(announcements)
               if a.hands or a.in_place]
    chose = {mode for _, mode in handing}
    if len(chose) < 2:
        return None
    asynchronous = _ranks([rank for rank, mode in handing if mode])
    other = _ranks([rank for rank, mode in handing if not mode])
    return f"rank(s) {asynchronous} asked for ASYNC, rank(s) {other} for SYNC or NO_UPLOAD"


def _directory_name(announcements: list[Announcement], in_place: bool) -> str | None:
    """The ``checkpoint_dir_name`` every rank that gave one agrees on, checked."""
    names = {a.dir_name for a in announcements if a.dir_name is not None}
    if not names:
        return None
    name = names.pop()
    if names:
        raise CheckpointError(
            f"ranks gave different checkpoint_dir_name values ({sorted([name, *names])}); give "
            "every rank the same name, or None.")
    problem = custom_dirname_problem(name)
    if problem is not None:
        raise CheckpointError(f"report(checkpoint_dir_name={name!r}): {problem}.")
    if in_place:
        raise CheckpointError(
            f"report(checkpoint_dir_name={name!r}) cannot rename a checkpoint written in place: "
            "get_checkpoint_dir() is already the directory it is committed in; drop the name, "
            "or hand a directory of your own.")
    return name


def settled_everywhere(announcements: list[Announcement], pending: list[str]
                        ) -> tuple[list[tuple[str, list[Persisted]]], list[RankFailure]]:
    """The oldest of the ``pending`` checkpoints that every rank has finished, in order, with
    what each rank persisted; and the failures of the next one, when a rank's failed."""
    done = [{f.directory: f for f in a.settled} for a in announcements]
    ready: list[tuple[str, list[Persisted]]] = []
    for directory in pending:
        outcomes = [d.get(directory) for d in done]
        failures = [o.failure for o in outcomes if o is not None and o.failure is not None]
        if failures:
            return ready, failures
        if any(o is None for o in outcomes):
            break
        ready.append((directory, [o.persisted or Persisted([]) for o in outcomes if o]))
    return ready, []


def raise_background_failure(directory: str, failures: list[RankFailure]) -> None:
    raise_failures(failures, f"persisting {directory} in the background", CommitError, wrap=True)


def check_agreed(heard: list[Any], kind: type, call: str) -> None:
    """Every rank made the same collective call: a rank in ``report()`` while another asks
    ``should_checkpoint()`` (say, on rank 0 alone) pairs two different calls."""
    other = [rank for rank, value in enumerate(heard) if not isinstance(value, kind)]
    if other:
        raise ReportMismatchError(
            f"rank(s) {_ranks(other)} made another collective call where the others called "
            f"{call}; every rank must call {call} and report() the same number of times, in "
            "the same order (ask on every rank, then act on rank 0 alone if you like).")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def check_counts(announcements: list[Announcement]) -> None:
    check_agreed(announcements, Announcement, "report()")
    kinds = {(a.kind, a.number) for a in announcements}
    if len(kinds) == 1:
        return
    lines = [f"rank {r}: called report() for the {_ordinal(a.number)} time" if a.kind == REPORT
             else f"rank {r}: returned from the training function after {a.number} report() call(s)"
             for r, a in enumerate(announcements)]
    raise ReportMismatchError(
        "ranks disagree on the number of report() calls; every rank must call report() the same "
        "number of times (report is collective; pass checkpoint=None on ranks without files):\n  "
        + "\n  ".join(lines))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
