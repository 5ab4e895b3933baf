"""This rank writing its share of a planned checkpoint: now, inside ``report()`` (files
written in place hashed and synced where they are; handed files persisted; the user's
``checkpoint_upload_fn`` run, then what it uploaded hashed), or in the background, where
``report()`` only hands the files over into staging (or hands the upload function over) and
the in-flight thread does the rest. The room where a new way to write a share goes (a
staging snapshot of GPU state).

This rank's checkpoints in flight: persisted one after another on a background thread,
oldest first, until the training thread learns at a collective point that every rank has
finished one and rank 0 committed it. :class:`InFlight` is the one owner of that set on a
rank: rank 0's coordinator keeps only the order in which the reports are written, and the
levels ask it where a committed checkpoint lies. The background thread touches MPI only for
a cached checkpoint's partner copy, on a communicator of its own (``run.levels``).

The ranks' resume states (each rank's random streams and loaders' positions, as bytes the
session gives) kept as files of the checkpoint they go with: one file a node,
``.hpckit-resume/node-NNNNN`` named by the node's first rank (its leader), which writes its
node's states beside its own share, as the node leaders write a checkpoint's records. So a
checkpoint creates a file a node, not a rank (102,400 ranks in nodes of 8: 12,800). It is
recorded like any file, so that it is committed, verified, exported and deleted with the
checkpoint. Names under that folder in a handed or in-place directory are hpckit's, never
the user's: listings leave them out. A checkpoint written before states went by node holds
``rank-NNNNN`` files, read as they are.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, replace

import pyarrow.fs

from hpckit import faults
from hpckit.background import IDLE, Worker
from hpckit.checkpoint import wait_until_written
from hpckit.errors import CheckpointError, ProtocolError
from hpckit.experiment import ownership
from hpckit.experiment.manifest import RANK_STATE_DIR, FileRecord
from hpckit.experiment.records import PARTS_DIR, part_name, render_records
from hpckit.run.mpi.comm import RankFailure, captured
from hpckit.run.writing.plan import Announcement, Finished, NodeRecords, Persisted, Placement, Plan
from hpckit.run.writing.shares import Meeting, hash_uploaded, sync_in_place, write_share
from hpckit.run.writing.staging import (
    Handed,
    Staging,
    Taken,
    hand_over,
    same_filesystem,
    upload,
    uploaded_taken,
)
from hpckit.storage import files
from hpckit.storage.copy import checksum_of
from hpckit.storage.location import Location


@dataclass(frozen=True)
class ShareWriter:
    """One rank's writer for one attempt."""

    rank: int
    size: int
    staging: Staging
    in_flight: InFlight
    meeting: Meeting

    def now(self, plan: Plan, handed: Handed, target: Location, state: bytes | None = None
            ) -> Persisted:
        """Persist this rank's share (and its resume ``state``) into ``target`` before
        ``report()`` returns."""
        return with_state(lambda: self._now(plan, handed, target), target, self.rank, state)()

    def _now(self, plan: Plan, handed: Handed, target: Location) -> Persisted:
        if plan.placement is Placement.UPLOADED:
            persisted = self._uploaded(handed, target, background=False)
        elif plan.placement is Placement.IN_PLACE:
            if handed.checkpoint is not None:  # an asynchronous save made synchronous
                wait_until_written(handed.checkpoint)
            persisted = sync_in_place(self._in_place_source(plan, handed), target, self.rank,
                                      self.size, later=plan.later)
        else:
            persisted = Persisted(write_share(plan, target, handed.source, self.rank))
        faults.reached("written", self.rank)
        return persisted

    def in_background(self, plan: Plan, handed: Handed, target: Location,
                      state: bytes | None = None) -> None:
        """Start persisting this rank's share (and its resume ``state``) on the in-flight
        thread; a failed hand-over is raised there, so that every rank learns of it at the
        next collective step."""
        directory = plan.checkpoint()[0]
        if plan.placement is Placement.UPLOADED:
            background = self.meeting.in_background()
            uploaded = with_state(lambda: self._uploaded(handed, target, background), target,
                                  self.rank, state)
            self.in_flight.start(directory, target,
                                 uploaded if background else done_now(uploaded), None,
                                 uploaded_taken(handed, self.rank))
            return
        if plan.placement is Placement.IN_PLACE:
            self.in_flight.start(directory, target, with_state(
                lambda: self._in_place(plan, handed, target), target, self.rank, state))
            return
        taken, failure = captured(self.rank, lambda: self._hand_over(plan, handed))
        staged = taken.staged if taken is not None else None

        def staged_files() -> Persisted:
            if failure is not None:
                raise CheckpointError(f"rank {self.rank}: handing over {handed.source}: "
                                      f"{failure.error}")
            records = (write_share(plan, target, staged, self.rank, phase="background",
                                   link=same_filesystem(staged, target)) if staged else [])
            faults.reached("persisted", self.rank)
            return Persisted(records)

        self.in_flight.start(directory, target, with_state(staged_files, target, self.rank, state),
                             plan, taken)

    def _in_place(self, plan: Plan, handed: Handed, target: Location) -> Persisted:
        if handed.checkpoint is not None:
            wait_until_written(handed.checkpoint)
        source = self._in_place_source(plan, handed)
        persisted = sync_in_place(source, target, self.rank, self.size, "background", plan.later)
        if not target.is_local:
            self.staging.release(source)
        faults.reached("persisted", self.rank)
        return persisted

    def _uploaded(self, handed: Handed, target: Location, background: bool) -> Persisted:
        """This rank's upload function run, the ranks met, and this rank's share hashed. A
        rank whose function failed still meets the others, then raises."""
        failure: Exception | None = None
        try:
            upload(handed, target, self.rank)
        except Exception as exc:  # noqa: BLE001  (raised once the ranks met)
            failure = exc
        self.meeting.meet(background)
        if failure is not None:
            raise failure
        persisted = hash_uploaded(target, self.rank, self.size,
                                  "background" if background else "writing")
        if background:
            faults.reached("persisted", self.rank)
        return persisted

    def pinned(self, handed: Handed) -> Handed:
        """Before the ranks meet: ``handed``, reading from links where it is a committed
        checkpoint that retention may evict at that meeting (:func:`pinned`)."""
        return pinned(handed, self.staging)

    def _hand_over(self, plan: Plan, handed: Handed) -> Taken | None:
        if handed.source is None:
            return None
        directory, index = plan.checkpoint()
        staged = self.staging.for_files(handed.source, directory)
        taken = hand_over(handed.source, staged, plan.writes.get(self.rank, []),
                          plan.hashes.get(self.rank, []), handed.owned, set(plan.shared),
                          directory, index, self.rank)
        if handed.pinned:
            self.staging.release(handed.source)
        faults.reached("handed", self.rank)
        return taken

    def _in_place_source(self, plan: Plan, handed: Handed) -> str:
        """In-place: on POSIX each rank hashes a share, on object storage uploads its own."""
        return handed.source or self.staging.in_place(plan.checkpoint()[0])


def pinned(handed: Handed, staging: Staging) -> Handed:
    """``handed``, reading from links this rank pins where its source is a committed checkpoint
    of any experiment; as it was otherwise.

    A committed checkpoint handed to ``report()`` again (``report(checkpoint=get_checkpoint())``
    after an evaluation-only epoch, or another experiment's checkpoint) is read from links to
    its files that this rank makes in its staging before the ranks meet. At that meeting rank 0
    may commit an earlier report's checkpoint and retention evict the very checkpoint handed
    here, deleting it while the hand-over still reads it: the links keep its bytes until the
    hand-over is done, and the committed files themselves are never changed (links are only
    read, then removed)."""
    source = handed.source
    if (source is None or handed.in_place or handed.files is None
            or not ownership.in_experiment(source)):
        return handed
    pin = staging.pin(source, [name for name, _ in handed.files])
    return replace(handed, source=pin, pinned=True)


def node_part(plan: Plan, target: Location, members: tuple[int, ...],
              per_rank: list[Persisted]) -> NodeRecords:
    """On a node's leader, where the leaders write a checkpoint's records (``Plan.by_nodes``,
    inside ``comm.all_reduce_by_nodes``): its ranks' records merged and written as the node's
    part of the records of the checkpoint at ``target``
    (``<checkpoint>/.hpckit-records/rank-N.json``, ``experiment.records``). Rank 0 gets the
    part's name (by the leader's rank), checksum and count, the node's bytes, and the records
    of the names several ranks hand, which it compares across nodes
    (``planning.check_nodes``), so that its share of the commit grows with the nodes."""
    directory = plan.checkpoint()[0]
    records = [r for persisted in per_rank for r in persisted.records]
    own = sorted((r for r in records if plan.shared.get(r.path, r.rank) == r.rank),
                 key=lambda r: r.path)
    data = render_records(directory, own)
    name = part_name(directory, members[0])
    if target.is_local:  # object storage has no directories (a marker object would be one more)
        files.make_dir(target.join(PARTS_DIR))
        files.fsync_dir(target.path)  # the folder's entry, made after the ranks synced theirs
    files.write_atomic(target.join(name.removeprefix(f"{directory}/")), data)
    return NodeRecords(members[0], len(members), checksum_of(data), len(own),
                       sum(r.size for r in own),
                       [r for r in records if r.path in plan.shared])


Pair = tuple[Announcement | None, RankFailure | None]  # what a rank sends at a step


def finished_by_node(in_flight: InFlight, members: tuple[int, ...], pairs: list[Pair]
                     ) -> list[Pair]:
    """On a node's leader, as its node's announcements pass on to rank 0 while checkpoints
    whose records the leaders write are in flight (``Plan.by_nodes``, in the background): no
    rank's own records of them go on, and once every rank of the node has finished one, the
    leader writes the node's part (once) and sends its :class:`NodeRecords` in its own
    ``Finished``. A failure to write the part is the leader's failure of that checkpoint."""
    announced = [a for a, _ in pairs]
    for flight, plan in in_flight.by_nodes():
        announced = _by_node(in_flight, flight.directory, plan, flight.committed_at, members,
                             announced)
    return [(a, failure) for a, (_, failure) in zip(announced, pairs, strict=True)]


def _by_node(in_flight: InFlight, directory: str, plan: Plan, target: Location,
             members: tuple[int, ...], announced: list[Announcement | None]
             ) -> list[Announcement | None]:
    done = [_finished(a, directory) for a in announced]
    node, failure = in_flight.parts.get(directory), None
    if node is None and all(f is not None and f.failure is None for f in done):
        node, failure = captured(members[0], lambda: node_part(
            plan, target, members, [f.persisted or Persisted([]) for f in done if f]))
        if node is not None:
            in_flight.parts[directory] = node

    def condensed(leader: bool, finished: Finished) -> Finished:
        if finished.failure is not None or finished.directory != directory:
            return finished
        if leader and failure is not None:
            return Finished(directory, failure=failure)
        return Finished(directory, node=node if leader and node is not None else None)

    return [a._replace(finished=tuple(condensed(i == 0, f) for f in a.finished))
            if a is not None else None for i, a in enumerate(announced)]


def _finished(announcement: Announcement | None, directory: str) -> Finished | None:
    if announcement is None:
        return None
    return next((f for f in announcement.finished if f.directory == directory), None)


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


PART = "node-"
_FT = pyarrow.fs.FileType


def state_name(leader: int) -> str:
    """The file of the states of the node whose first rank is ``leader``."""
    return f"{RANK_STATE_DIR}/{PART}{leader:05d}"


def node_states(members: Sequence[int], states: Sequence[bytes | None]) -> bytes | None:
    """The file of a node's states: its ranks' (``members``, in the node's order), where
    they have one; None where none has."""
    kept = {rank: state for rank, state in zip(members, states, strict=True) if state is not None}
    return pickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL) if kept else None


def write_state(target: Location, leader: int, data: bytes) -> FileRecord:
    """``data`` written durably into checkpoint ``target`` as the node's states file."""
    name = state_name(leader)
    if target.is_local:  # object storage has no directories (a marker object would be one more)
        files.make_dir(target.join(RANK_STATE_DIR))
    files.write_atomic(target.join(name), data)
    faults.reached("resume_state", leader)
    return FileRecord(name, len(data), leader, checksum_of(data))


def with_state(persist: Callable[[], Persisted], target: Location, rank: int,
               state: bytes | None) -> Callable[[], Persisted]:
    """``persist``, then the node's states file written (on its leader, where ``state`` is
    not None) and added to what it persisted."""
    if state is None:
        return persist

    def persisted() -> Persisted:
        done = persist()
        return done._replace(records=[*done.records, write_state(target, rank, state)])

    return persisted


def read_state(checkpoint: Location, rank: int, leader: int) -> bytes | None:
    """``rank``'s state in a committed checkpoint: from its node's file (``leader``: its
    node's first rank now); where the ranks lay on other nodes when it was written, from the
    file that holds it; None where none does."""
    found = _part(checkpoint.join(state_name(leader)))
    if rank in found:
        return found[rank]
    listed = files.list_dir(checkpoint.join(RANK_STATE_DIR))
    names = sorted(i.base_name for i in listed if i.type == _FT.File)
    if f"rank-{rank:05d}" in names:  # written before the states went by node
        return files.read_bytes(checkpoint.join(RANK_STATE_DIR, f"rank-{rank:05d}"))
    for name in names:
        if name.startswith(PART) and name != state_name(leader).rsplit("/", 1)[1]:
            part = _part(checkpoint.join(RANK_STATE_DIR, name))
            if rank in part:
                return part[rank]
    return None


def _part(location: Location) -> dict[int, bytes]:
    if files.file_type(location) != _FT.File:
        return {}
    found = pickle.loads(files.read_bytes(location))
    return found if isinstance(found, dict) else {}
