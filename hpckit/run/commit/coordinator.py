"""Rank 0's role in the commit protocol: it alone decides. From every rank's announcement it
makes the step's plan (:meth:`Coordinator.plan`): it keeps the files each rank handed
(``writing.assignment.HandedFiles``), checks the lock and the validations, refuses what the
ledger refuses, commits the background checkpoints every rank has finished, chooses the level
(``run.levels``), and tells the callbacks and the stop criterion. It commits what the ranks
persisted through its :class:`~hpckit.run.commit.ledger.Ledger`, which owns the reports not
yet written and the experiment they go to.

The other ranks' side (announcing, writing their shares, meeting) is
:class:`~hpckit.run.commit.protocol.CommitProtocol`'s; the messages both send are
``writing.plan``'s ``Announcement`` and ``Plan``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hpckit import settings
from hpckit.errors import HpckitError, ReportMismatchError
from hpckit.experiment.manifest import CACHE, STORAGE
from hpckit.run.commit.callbacks import Callbacks
from hpckit.run.commit.ledger import Ledger
from hpckit.run.ending import stop
from hpckit.run.levels.levels import Levels
from hpckit.run.mpi.comm import RankFailure
from hpckit.run.writing.assignment import HandedFiles, every_part
from hpckit.run.writing.plan import REPORT, Announcement, NodeRecords, Persisted, Placement, Plan
from hpckit.run.writing.planning import make_plan


class Coordinator:
    """Rank 0's side of the protocol for one attempt."""

    def __init__(self, ledger: Ledger, callbacks: Callbacks, levels: Levels | None,
                 stop_when: Any, name: str) -> None:
        self.ledger = ledger
        self.callbacks = callbacks
        self.levels = levels  # CheckpointConfig(cache_dir)
        self.stop_when = stop_when  # RunConfig.stop
        self.name = name  # the experiment's, for the stop criterion's line
        self.handed = HandedFiles()  # every rank's files, as they last announced them

    def plan(self, announcements: list[Announcement], step: int, index: int,
             metrics: dict[str, Any], validation: dict[str, Any] | None) -> Plan:
        """The plan of the step every rank announced; ``step`` and ``index`` are the next
        report's and checkpoint's, ``metrics`` and ``validation`` rank 0's own report's."""
        ledger = self.ledger
        # First the plan, which keeps every list of files the ranks announced: they take
        # them for known from now on, even where this step then fails.
        try:
            plan = make_plan(announcements, step, index, self.handed)
        except ReportMismatchError:
            raise
        except HpckitError as refusal:  # of this report's files: as a rank's failure to prepare
            plan = Plan(step, refused=(RankFailure.capture(0, refusal),))
        ledger.experiment.check_lock()  # a run that lost its lock fails here, on every rank
        ledger.check_validations()  # so does one whose validation could not be recorded
        if plan.refused:  # what the ranks finished before commits first; then they raise
            return replace(plan, committed=ledger.commit_finished(announcements),
                           committing=ledger.committer.directories)
        report = announcements[0].kind == REPORT
        if report and plan.directory is not None:
            ledger.prepare(plan, index)  # may refuse the report: before anything commits
            ledger.ask_validation(plan.directory, validation)
        # At a report, rank 0 writes the commits in the background and replies at once (a
        # later step says they are committed); a drain, the end and the caches' levels wait for them.
        plan = replace(plan, committed=ledger.commit_finished(
            announcements, report and self.levels is None),
                       committing=ledger.committer.directories)
        plan = self._by_nodes(self._leveled(plan))
        if not report:
            return plan
        ledger.say_if_mixed(plan, announcements, self.levels is not None)
        if self.callbacks:  # each rank's own dict: a node's alike announcements share one
            self.callbacks.heard(plan.step, [dict(a.metrics or {}) for a in announcements])
        if plan.directory is None:
            ledger.log(plan.step, metrics)
        elif plan.asynchronous:
            ledger.expect(plan, metrics)
        met = stop.criterion_met(self.stop_when, self.name, metrics, plan.step + 1)
        return replace(plan, criterion_met=met)

    def _by_nodes(self, plan: Plan) -> Plan:
        """A checkpoint whose many records the node leaders merge and write: handed to
        storage_path, now (``writer.node_part``) or in the background
        (``writer.finished_by_node``)."""
        many = self.handed.count > settings.current().inline_records
        if (plan.directory is None or plan.level != STORAGE
                or plan.placement is not Placement.HANDED or not many):
            return plan
        return replace(plan, by_nodes=True)

    def _leveled(self, plan: Plan) -> Plan:
        """With node-local caches: the plan's level, and for the caches every rank's part
        (a partner node receives every rank's files)."""
        if self.levels is None:
            return plan
        kept = tuple(r.directory for r in self.ledger.experiment.manifest.checkpoints)
        plan = self.levels.leveled(plan, kept + self.ledger.pending)
        return every_part(plan, self.handed.now) if plan.level == CACHE else plan

    def commit(self, plan: Plan, per_rank: list[Persisted], metrics: dict[str, Any],
               started: float) -> None:
        """Commit the checkpoint of ``plan`` that the ranks persisted."""
        self.ledger.commit(plan, per_rank, metrics, started)

    def commit_nodes(self, plan: Plan, nodes: list[NodeRecords], metrics: dict[str, Any],
                     started: float) -> None:
        """Commit the checkpoint of ``plan`` whose records the node leaders wrote."""
        self.ledger.commit_nodes(plan, nodes, metrics, started)

    def discard(self, directory: str) -> None:
        """A checkpoint that failed before its commit."""
        self.ledger.experiment.discard(directory)

    def quiet(self) -> bool:
        """Whether rank 0 has nothing to tell the ranks at a metrics-only report."""
        return self.ledger.quiet()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """A metrics-only report's line."""
        self.ledger.log(step, metrics)

    def finish(self) -> None:
        """A run that finished: every validation ends before the run does."""
        self.ledger.finish_validations()

    def close(self) -> None:
        """At the end of the attempt (see :meth:`Ledger.close`)."""
        self.ledger.close()
