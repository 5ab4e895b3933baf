"""The commit protocol behind ``report()``: two collective steps, each one :func:`all_reduce`.

1. Announce and plan. Every rank lists the files it hands in; rank 0 checks that all ranks
   are at the same report, assigns each file name to one writer, and sends the plan.
2. Persist and commit. Writers persist their files (hashing as they write); ranks holding a
   duplicate name only hash theirs. Rank 0 gathers every outcome; only if all succeeded does
   its :class:`~hpckit.experiment.Experiment` replace the manifest (the commit) and append
   the metrics line. Every rank then learns the outcome, or one error raised everywhere.

Deleting what retention evicts happens after step 2, in the background (see
``experiment.purge``): no rank waits on it inside ``report()``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from hpckit import faults
from hpckit.checkpoint import Checkpoint
from hpckit.config import CheckpointConfig
from hpckit.errors import CommitError, HpckitError
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.manifest import CheckpointRecord, FileRecord
from hpckit.experiment.values import to_json_metrics
from hpckit.logs import log
from hpckit.run import stop
from hpckit.run.comm import all_reduce, attempt
from hpckit.run.persist import list_source, local_source, persist
from hpckit.run.plan import FINISH, REPORT, Announcement, Plan, make_plan, merge
from hpckit.storage import files
from hpckit.storage.location import Location


@dataclass(frozen=True)
class Outcome:
    """What a report did: the stop the ranks agreed on (if any), the checkpoint it committed."""

    stop: str | None
    committed: Checkpoint | None


class CommitProtocol:
    """One rank's side of the protocol for one attempt; ``owner`` is rank 0's experiment."""

    def __init__(self, comm: Any, experiment: Location, config: CheckpointConfig, next_step: int,
                 owner: Experiment | None, latest: Checkpoint | None) -> None:
        self.comm = comm
        self.experiment = experiment
        self.config = config
        self.next_step = next_step
        self.owner = owner
        self.latest = latest
        self.reports = 0
        self.last_metrics: dict[str, Any] | None = None

    def report(self, metrics: Any, checkpoint: Checkpoint | None) -> Outcome:
        rank = self.comm.rank
        self.reports += 1
        prepared, failure = attempt(rank, lambda: _prepare(metrics, checkpoint, rank))
        converted, source, listed = prepared or (None, None, None)
        if rank == 0:
            self.last_metrics = converted
        announcement = Announcement(REPORT, self.reports, listed, failure, stop.received())
        plan = all_reduce(self.comm, "report()", lambda: announcement, self._plan, CommitError)
        if plan.directory is None:
            self.next_step = plan.step + 1
            return Outcome(plan.stop, None)
        started = time.perf_counter()
        target = self.experiment.join(plan.directory)

        def write() -> list[FileRecord]:
            records = persist(plan, target, source, rank)
            faults.reached("written", rank)
            return records

        all_reduce(self.comm, f"persisting {plan.directory}", write,
                   lambda per_rank: self._commit(plan, target, per_rank, started), CommitError,
                   patient=True, undo=lambda: _discard(target))
        self.latest = Checkpoint._at(target)
        self.next_step = plan.step + 1
        if self.owner is not None:
            self.owner.purge_evicted()
        return Outcome(plan.stop, self.latest)

    def finish(self) -> None:
        """Collective end of the training function: catches ranks that reported fewer times."""
        all_reduce(self.comm, "report()", lambda: Announcement(FINISH, self.reports),
                   lambda announced: make_plan(announced, self.next_step, 0), CommitError)

    def _plan(self, announcements: list[Announcement]) -> Plan:
        owner = self._owner()
        plan = make_plan(announcements, self.next_step, owner.manifest.next_checkpoint_index)
        if plan.directory is not None:
            owner.wait_for_purge()
            return plan
        owner.log_report(plan.step, self.last_metrics or {})
        if log.isEnabledFor(logging.INFO):
            log.info("step %d: %s", plan.step, summary(self.last_metrics or {}))
        return plan

    def _commit(self, plan: Plan, target: Location, per_rank: list[list[FileRecord]],
                started: float) -> None:
        owner = self._owner()
        try:
            written = merge(plan, per_rank)
        except HpckitError:
            _discard(target)
            raise
        record = CheckpointRecord(owner.manifest.next_checkpoint_index, target.name, plan.step,
                                  time.time(), self.last_metrics or {}, tuple(written))
        owner.commit(record, self.config)
        log.info("step %d: %s; committed %s (%s in %d file(s)) in %.0f ms", plan.step,
                 summary(record.metrics), target.name, human_size(record.size), len(written),
                 (time.perf_counter() - started) * 1000)

    def _owner(self) -> Experiment:
        if self.owner is None:
            raise RuntimeError(f"rank {self.comm.rank} asked for rank 0's experiment")
        return self.owner


def _prepare(metrics: Any, checkpoint: Checkpoint | None, rank: int
             ) -> tuple[dict[str, Any], str | None, list[tuple[str, int]] | None]:
    converted = to_json_metrics(metrics)
    if checkpoint is None:
        return converted, None, None
    source = local_source(checkpoint, rank)
    return converted, source, list_source(source, rank)


def _discard(target: Location) -> None:
    try:
        files.delete_dir(target)
    except HpckitError as exc:
        log.warning("could not remove failed checkpoint %s (resume removes it): %s", target.name, exc)


def summary(metrics: dict[str, Any], most: int = 6) -> str:
    """The first few scalar metrics, compactly: ``loss=0.1234 acc=0.91``."""
    shown = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
             for k, v in metrics.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    return " ".join(shown[:most]) + (" ..." if len(shown) > most else "") or "(no metrics)"


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
