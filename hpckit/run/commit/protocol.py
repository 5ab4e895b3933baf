"""The commit protocol behind ``report()``: collective steps, each one :func:`all_reduce`.

1. Announce and plan. Every rank lists the files it hands in (or says it wrote them in place)
   and which of its background checkpoints have finished; rank 0 checks that all ranks are at
   the same report, commits the background checkpoints every rank has finished, assigns each
   name several ranks hand to one writer (``writing.plan.own_part``: each rank derives its own
   part) and a level (storage_path, or the node caches: ``run.levels``), and sends the plan.
2. Synchronous: persist and commit. Writers persist their files (hashing as they write); ranks
   holding a duplicate name only hash theirs. Rank 0 gathers every outcome; only if all
   succeeded does its :class:`~hpckit.experiment.Experiment` replace the manifest (the commit).
   Asynchronous: each rank hands its files over (a rename into staging where it can) and a
   background thread persists them; a later announcement (or a drain, when the in-flight limit
   is reached, a stop is agreed or the training function returns) commits them.

0. Quiet or not. Every announcement starts with one Iallreduce of three integers: a report
   with metrics only, where no rank has more to say and rank 0 nothing to tell (no checkpoint
   in flight or being committed, its lock held), ends there: every rank makes the same plan,
   and rank 0 hands the metrics line to its writer. Any other takes the steps below.

What retention evicts is deleted after the commit, in the background (``experiment.purge``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from hpckit.checkpoint import Checkpoint, checkpoint_at
from hpckit.config import CheckpointConfig, CheckpointUploadMode
from hpckit.errors import CommitError, ControllerError, HpckitError, ProtocolError
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.manifest import CACHE, checkpoint_dirname
from hpckit.experiment.values import to_json_metrics
from hpckit.logs import log
from hpckit.run.commit.coordinator import Callbacks, Coordinator
from hpckit.run.ending import stop
from hpckit.run.levels.levels import Levels
from hpckit.run.mpi.comm import (
    RankFailure,
    all_reduce,
    all_reduce_by_nodes,
    captured,
    on_root,
    raise_failures,
)
from hpckit.run.mpi.group import Group
from hpckit.run.mpi.waiting import quiet_everywhere, to_root
from hpckit.run.validation.validator import Validator
from hpckit.run.writing.plan import (
    DRAIN,
    REPORT,
    RETURNED,
    Announcement,
    NodeRecords,
    Persisted,
    Plan,
    SentFiles,
    own_part,
)
from hpckit.run.writing.shares import Meeting
from hpckit.run.writing.staging import Handed, Staging, Upload, hand_in, release
from hpckit.run.writing.writer import InFlight, ShareWriter, finished_by_node, node_part, node_states
from hpckit.storage.location import Location


@dataclass(frozen=True)
class Outcome:
    """What a report did: the newest checkpoint it committed (its own, or a background one
    that finished), and whether ``RunConfig(stop=...)`` was met."""

    committed: Checkpoint | None
    criterion_met: bool = False


class CommitProtocol:
    """One rank's side of the protocol for one attempt; ``experiment`` is rank 0's (None elsewhere)."""

    def __init__(self, group: Group, location: Location, config: CheckpointConfig,
                 progress: tuple[int, int], experiment: Experiment | None, latest: Checkpoint | None,
                 staging: Staging, callbacks: Callbacks, stop_when: Any = None,
                 levels: Levels | None = None, validator: Validator | None = None) -> None:
        self.group = group  # a step's values reach rank 0 through the node leaders
        self.comm = comm = group.world
        self.location = location
        self.config = config
        self.next_step, self.next_index = progress
        self.experiment = experiment  # rank 0's, which its coordinator alone changes
        self.callbacks = callbacks
        self.stop_when = stop_when  # RunConfig.stop
        self.levels = levels  # CheckpointConfig(cache_dir)
        self.coordinator = (Coordinator(experiment, config, callbacks, levels, validator,
                                        stop_when, location.name)
                            if experiment is not None else None)
        self.latest = latest
        self.stop: str | None = None  # the stop every rank agreed on; stop.received() is a rank's
        self.staging = staging
        self.in_flight = InFlight(comm.rank)
        self.share_writer = ShareWriter(comm.rank, comm.size, staging, self.in_flight, Meeting(comm))
        self.reports = 0
        self.last_metrics: dict[str, Any] = {}
        self.last_validation: dict[str, Any] | None = None  # rank 0's report(validation=...)
        self._mine: dict[str, Any] | None = None
        self._told_of_wait = False
        self._broken: HpckitError | None = None
        self._committing: tuple[str, ...] = ()  # in flight, their commits being written
        self._sent = SentFiles()  # the files this rank last told rank 0 of

    def checkpoint_dir(self) -> str:
        """Where this rank writes the next checkpoint in place."""
        return self.staging.in_place(checkpoint_dirname(self.next_index))

    def report(self, metrics: Any, checkpoint: Checkpoint | None, upload: Upload) -> Outcome:
        rank, before = self.comm.rank, self.latest
        self.reports += 1
        handed, failure = captured(rank, lambda: self._prepare(metrics, checkpoint, upload))
        failure = failure or self._callback_failure()
        handed = handed or Handed()
        files, same_files_as = self._sent.compact(handed.files, self.reports)
        plan = own_part(self._announce(Announcement(
            REPORT, self.reports, files, failure, stop.received(), handed.in_place,
            self.in_flight.finished(), upload.mode is CheckpointUploadMode.ASYNC, upload.dir_name,
            self._mine if self.callbacks else None, handed.later, handed.upload_fn is not None,
            same_files_as, upload.keeps)), rank, handed.files)
        state = self._node_state(plan, upload)
        if self.levels is not None:
            self.levels.tidy(plan)
        if plan.directory is None:
            if plan.stop:
                self._drain()
                self._persist_latest(f"the stop ({plan.stop})")  # what the drain committed
        elif plan.asynchronous and plan.level != CACHE:
            self._make_room()
            self.share_writer.in_background(plan, handed, self.location.join(plan.checkpoint()[0]),
                                      state)
        else:
            if plan.asynchronous:  # cached now, copied to the partner node in the background
                self._make_room()
            else:
                self._drain()
            if self._persist_now(plan, handed, state):
                release(handed, self.location.is_local)
        self.callbacks.call_due()
        return Outcome(self.latest if self.latest is not before else None, plan.criterion_met)

    def _node_state(self, plan: Plan, upload: Upload) -> bytes | None:
        """Where ``plan`` writes a checkpoint and ranks keep resume states: on each node's
        leader, the states of the node's ranks as the one file it writes of them
        (collective on the node); None on the others."""
        if not plan.states or plan.directory is None:
            return None
        mine = upload.rank_state() if upload.rank_state is not None else None
        node = self.group.node
        gathered = [mine] if node.size == 1 else to_root(node, mine)
        return node_states(self.group.members, gathered) if gathered is not None else None

    def returned(self) -> None:
        """Collective end of the training function: commits what is still in the background,
        and catches ranks that reported fewer times."""
        self.in_flight.wait()
        self._announce(Announcement(RETURNED, self.reports, finished=self.in_flight.finished(),
                                    failure=self._callback_failure()))
        self.callbacks.call_due()
        failure = self._callback_failure()
        if failure is not None:  # a callback of the last reports: every rank must hear of it
            self._announce(Announcement(RETURNED, self.reports, failure=failure))
        self._persist_latest("the last checkpoint of the run")
        if self.levels is not None:
            self.levels.release()
        self.share_writer.meeting.release()
        if self.coordinator is not None:
            self.coordinator.finish()

    def _callback_failure(self) -> RankFailure | None:
        """A UserCallback that raised on rank 0, as the failure every rank will raise."""
        error, self.callbacks.error = self.callbacks.error, None
        if error is None:
            return None
        return RankFailure.capture(self.comm.rank, ControllerError(error))

    def close(self, promptly: bool = False) -> None:
        """At the end of the attempt; ``promptly`` (after Ctrl-C) does not wait for a file
        operation under way, and leaves the staged files to the next attempt."""
        if self.levels is not None:
            self.levels.abandon()
        self.share_writer.meeting.abandon()
        if self.coordinator is not None:
            self.coordinator.close()
        self.in_flight.close(wait=not promptly)
        if not promptly:
            self.staging.remove()

    def _prepare(self, metrics: Any, checkpoint: Checkpoint | None, upload: Upload) -> Handed:
        converted = to_json_metrics(metrics)
        self._mine = converted
        if self.comm.rank == 0:
            self.last_metrics, self.last_validation = converted, upload.validation
        if checkpoint is None:
            return Handed()
        pending = self.staging.in_place_path(checkpoint_dirname(self.next_index))
        return self.share_writer.pinned(hand_in(checkpoint, upload, self.comm.rank, pending, self.location))

    def _announce(self, announcement: Announcement) -> Plan:
        if self._broken is not None:
            raise self._broken
        try:
            by_nodes = partial(finished_by_node, self.in_flight) if self.in_flight.by_nodes() else None
            plan = self._quiet_plan(announcement) or all_reduce(
                self.group, "report()", lambda: announcement, self._coordinated, CommitError,
                prepare=by_nodes)
        except HpckitError as exc:
            if len(self.in_flight):
                # InFlight checkpoints may have been committed or dropped without every
                # rank learning which: this attempt's protocol ends here, on every rank alike.
                self._broken = exc
            raise
        if plan.stop and self.stop is None:
            self.stop = plan.stop
        self._committing = plan.committing
        newest = self.in_flight.drop_committed(plan.committed)
        if newest is not None:
            self._now_latest(newest)
        raise_failures(list(plan.refused), "report()", CommitError)
        if announcement.kind == REPORT:
            self.next_step = plan.step + 1
        if plan.index is not None:
            self.next_index = plan.index + 1
        return plan

    def _quiet_plan(self, announcement: Announcement) -> Plan | None:
        """A report that no rank has more to tell of than its metrics (and rank 0 nothing to
        tell them): agreed in one small Iallreduce, its plan made alike on every rank, the
        metrics line handed to rank 0's writer. None: the full step, gathers and all."""
        quiet = (announcement.quiet and not len(self.in_flight) and self.levels is None
                 and self.stop_when is None  # RunConfig(stop=...): rank 0 tells if it was met
                 and (self.coordinator is None or self.coordinator.quiet()))
        if not quiet_everywhere(self.comm, announcement.number, quiet):
            return None
        if self.coordinator is not None:
            self.coordinator.log(self.next_step, self.last_metrics)
        return Plan(self.next_step)

    def _drain(self, keep: int = 0) -> None:
        """Wait until at most ``keep`` background checkpoints run, and commit the others."""
        if len(self.in_flight) <= keep:
            return
        self.in_flight.wait(keep)
        self._announce(Announcement(DRAIN, self.reports, finished=self.in_flight.finished()))

    def _make_room(self) -> None:
        limit = self.config.max_checkpoints_in_flight
        if len(self.in_flight) - len(self._committing) < limit:
            return
        if not self._told_of_wait and self.comm.rank == 0:
            log.info("report() waits for the previous checkpoint to be persisted (%d in flight, "
                     "CheckpointConfig(max_checkpoints_in_flight=%d)); said once", limit, limit)
            self._told_of_wait = True
        self._drain(keep=limit - 1)

    def _persist_now(self, plan: Plan, handed: Handed, state: bytes | None) -> bool:
        """Whether this rank's files are safe (persisted, or cached for the background)."""
        directory = plan.checkpoint()[0]
        started = time.perf_counter()
        write: Callable[[], Persisted]
        if plan.level == CACHE and self.levels is not None:
            target, write = self.levels.write(plan, handed.source, state)
            if self.levels.partnered:
                return self.levels.copy_to_partner(plan, write, self.in_flight)
            what = f"caching {directory} on each node"
        else:
            target = self.location.join(directory)
            write = partial(self.share_writer.now, plan, handed, target, state)
            what = f"persisting {directory}"

        def commit(per_rank: list[Persisted]) -> None:
            self._rank0().commit(plan, per_rank, self.last_metrics, started)

        def commit_nodes(nodes: list[NodeRecords]) -> None:
            self._rank0().commit_nodes(plan, nodes, self.last_metrics, started)

        def undo() -> None:
            self._rank0().discard(directory)

        if plan.by_nodes:
            all_reduce_by_nodes(self.group, what, write, partial(node_part, plan, target),
                                commit_nodes, CommitError, undo)
        else:
            all_reduce(self.group, what, write, commit, CommitError, undo)
        self._now_latest(target)
        return True

    def _persist_latest(self, why: str) -> None:
        """Collective, with node-local caches: when the newest checkpoint is cached only, copy
        it to storage_path (each file from one node that holds it) and record it there, in a
        commit step as any other; then the caches keep only what the manifest names."""
        levels = self.levels
        if levels is None:
            return
        _, (record, kept) = on_root(self.comm, lambda: (None, self._rank0().cached_latest()),
                                    "finding the newest checkpoint", CommitError)
        if record is not None:
            copy, check = levels.persisting(record)

            def commit(per_rank: list[dict[str, str]]) -> None:
                check(per_rank)
                self._rank0().reached_storage(record.directory, why)

            all_reduce(self.comm, f"persisting {record.directory} to storage_path", copy, commit,
                       CommitError, undo=lambda: self._rank0().discard(record.directory))
        levels.tidy_after_persist(kept)

    def _now_latest(self, location: Location) -> None:
        """The one place that moves ``latest``: a checkpoint every rank knows is committed."""
        self.latest = checkpoint_at(location)

    def _coordinated(self, announcements: list[Announcement]) -> Plan:
        """Rank 0's plan for the step every rank announced."""
        return self._rank0().plan(announcements, self.next_step, self.next_index,
                                            self.last_metrics, self.last_validation)

    def _rank0(self) -> Coordinator:
        if self.coordinator is None:
            raise ProtocolError(f"rank {self.comm.rank} asked for rank 0's experiment in the "
                                "commit protocol")
        return self.coordinator
