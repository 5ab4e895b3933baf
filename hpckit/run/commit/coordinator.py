"""Rank 0's role in the commit protocol: it alone decides, in this one room (planning.py is
its pure part). From every rank's announcement it makes the step's plan
(:meth:`Coordinator.plan`): it keeps the files each rank handed (``planning.HandedFiles``),
checks the lock and the validations, refuses what cannot be written, commits the
background checkpoints every rank has finished, chooses the level (``run.levels``), and
tells the callbacks and the stop criterion. It keeps the reports in the order they were
made, and leaves them as metrics lines and checkpoint commits in that same order, however
late the background checkpoints before them finish: everything here runs inside a
collective step's reduce, and the writes of background checkpoints that every rank has
finished go to the :class:`Committer`, off the collective, at a report. What it commits
goes to the experiment through :class:`Experiment` alone.

The :class:`Committer`: a background checkpoint that every rank has finished used to be
committed inside the next report's collective step, while the other ranks waited for rank 0's
metrics line and manifest (a few milliseconds on a local disk, a hundred on a loaded Lustre or
S3). Rank 0 hands those writes to the experiment's writer thread and replies at once; the
next collective step tells every rank which commits are written. The writer makes every
change of the experiment in the order it was handed over, so metrics lines and manifests
keep the order of the reports. After a write fails, the later ones are not made: their
checkpoints are discarded, as they would have been had the commit run in the collective.

The other ranks' side (announcing, writing their shares, meeting) is
:class:`~hpckit.run.commit.protocol.CommitProtocol`'s; the messages both send are
``writing.plan``'s ``Announcement`` and ``Plan``.

Rank 0's calls of the run's UserCallbacks, in report order, outside the collectives.

The coordinator notes each report as it is recorded (inside rank 0's commit step); the calls are
made once the step is over, so a slow or failing callback cannot leave a commit half told.
A callback that raises is reported at the next ``report()`` (or at the end of the training
function) as a ``ControllerError`` on every rank, as Ray reports its controller's failures.
Reports are noted by rank 0's main thread (a synchronous commit) and by its commit thread (a
background one) while the main thread takes the due calls: one lock guards what is noted.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from hpckit import faults, settings
from hpckit.checkpoint import Checkpoint, checkpoint_at
from hpckit.config import CheckpointConfig
from hpckit.config.callbacks import TrainRunContext, UserCallback
from hpckit.errors import CheckpointError, HpckitError, ReportMismatchError
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.manifest import CACHE, STORAGE, CheckpointRecord, Validation, checkpoint_dirname
from hpckit.experiment.reading import records_of
from hpckit.experiment.records import indexed
from hpckit.experiment.retention import score_of
from hpckit.experiment.values import flatten
from hpckit.experiment.writer import Writer
from hpckit.logs import human_size, log, metrics_summary
from hpckit.run.commit.planning import (
    HandedFiles,
    attributed,
    check_copies,
    check_nodes,
    every_part,
    finished_everywhere,
    make_plan,
    merge,
    mixed_modes,
    raise_background_failure,
    unrecorded,
)
from hpckit.run.ending import stop
from hpckit.run.levels.levels import Levels
from hpckit.run.mpi.comm import RankFailure
from hpckit.run.validation.validator import Validator
from hpckit.run.writing.plan import REPORT, Announcement, NodeRecords, Persisted, Placement, Plan
from hpckit.run.writing.shares import hash_late
from hpckit.storage.location import Location


@dataclass(frozen=True)
class Entry:
    """One report not yet written to the experiment: a metrics line waiting behind a
    background checkpoint, or that checkpoint itself."""

    step: int
    metrics: dict[str, Any]
    plan: Plan | None
    started: float


class Coordinator:
    """Rank 0's side of the protocol for one attempt: its decisions, and the queue of the
    reports it has planned and not yet written."""

    def __init__(self, experiment: Experiment, config: CheckpointConfig,
                 callbacks: Callbacks | None = None, levels: Levels | None = None,
                 validator: Validator | None = None, stop_when: Any = None,
                 name: str = "") -> None:
        self.experiment = experiment
        self.levels = levels  # CheckpointConfig(cache_dir)
        self.stop_when = stop_when  # RunConfig.stop
        self.name = name  # the experiment's, for the stop criterion's line
        self.handed = HandedFiles()  # every rank's files, as they last announced them
        self.validator = validator
        self._validations: dict[str, dict[str, Any]] = {}  # directory: what to validate
        self.config = config
        self.callbacks = callbacks
        # every rank's hosts, recorded with a checkpoint in the node-local caches, and where
        # this node caches a checkpoint
        self.hosts = levels.nodes.hosts if levels else ()
        self.cached_at: Callable[[str], Location] | None = (
            levels.cache.location if levels else None)
        self._queue: deque[Entry] = deque()
        self.committer = Committer(experiment.writer)
        self._score_missing_said = False
        self._mixed_said = False

    def plan(self, announcements: list[Announcement], step: int, index: int,
             metrics: dict[str, Any], validation: dict[str, Any] | None) -> Plan:
        """The plan of the step every rank announced; ``step`` and ``index`` are the next
        report's and checkpoint's, ``metrics`` and ``validation`` rank 0's own report's."""
        # First the plan, which keeps every list of files the ranks announced: they take
        # them for known from now on, even where this step then fails.
        try:
            plan = make_plan(announcements, step, index, self.handed)
        except HpckitError as refusal:  # of this report's files: as a rank's failure to prepare
            if isinstance(refusal, ReportMismatchError) and not all(
                    isinstance(a, Announcement) for a in announcements):
                raise  # a rank in another collective call: it reads no plan
            # Ranks at different report() calls (or one returned) still finished what they
            # announced finished: it commits first, as for any refusal.
            plan = Plan(step, refused=(RankFailure.capture(0, refusal),))
        self.experiment.check_lock()  # a run that lost its lock fails here, on every rank
        self.check_validations()  # so does one whose validation could not be recorded
        report = announcements[0].kind == REPORT
        if report and (directory := plan.directory) is not None and not plan.refused:
            try:
                self.prepare(plan, index)  # its directory, before anything of it is written
            except CheckpointError as refusal:  # a name taken: refused as the files above
                plan = Plan(step, refused=(RankFailure.capture(0, refusal),))
            else:
                self.ask_validation(directory, validation)
        if plan.refused:  # what the ranks finished before commits first; then they raise
            return replace(plan, committed=self.commit_finished(announcements),
                           committing=self.committer.directories)
        # At a report, rank 0 writes the commits in the background and replies at once (a
        # later step says they are committed); a drain, the end and the caches' levels wait for them.
        plan = replace(plan, committed=self.commit_finished(
            announcements, report and self.levels is None),
                       committing=self.committer.directories)
        plan = self._by_nodes(self._leveled(plan))
        if not report:
            return plan
        self.say_if_mixed(plan, announcements, self.levels is not None)
        if self.callbacks:  # each rank's own dict: a node's alike announcements share one
            self.callbacks.heard(plan.step, [dict(a.metrics or {}) for a in announcements])
        if plan.directory is None:
            self.log(plan.step, metrics)
        elif plan.asynchronous:
            self.expect(plan, metrics)
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
        kept = tuple(r.directory for r in self.experiment.manifest.checkpoints)
        plan = self.levels.leveled(plan, kept + self.pending)
        return every_part(plan, self.handed.now) if plan.level == CACHE else plan

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """A report without a checkpoint: its line handed to the writer, after the checkpoints
        before it. Nothing waits for it: its failure fails the next collective step, and a
        line lost with a killed rank 0 is reported again by the resumed run."""
        if log.isEnabledFor(logging.INFO):
            log.info("step %d: %s", step, metrics_summary(metrics))
        if self._queue:
            self._queue.append(Entry(step, metrics, None, time.perf_counter()))
        else:
            self.committer.submit(None, partial(self._log_report, step, metrics), _nothing)

    def quiet(self) -> bool:
        """Whether the ranks need hear nothing at a report without a checkpoint: no checkpoint
        waits for its commit or is being committed, no write failed, the run holds its lock
        and no validation failed to be recorded (each of those makes the step a full one,
        which tells every rank)."""
        if self._queue or not self.committer.only_lines():
            return False
        if self.validator is not None and self.validator.error is not None:
            return False
        try:
            self.experiment.check_lock()
        except HpckitError:
            return False
        return True

    def prepare(self, plan: Plan, next_index: int) -> None:
        """Before any rank writes: the previous purge is done, a named directory is free (and
        marked pending), a stale one written in place and then not used is cleared."""
        directory = plan.checkpoint()[0]
        self.experiment.wait_for_purge()
        target = self.experiment.location.join(directory)
        if directory != checkpoint_dirname(next_index):
            self.experiment.reserve(directory, self.pending,
                                    plan.placement is Placement.UPLOADED)
        elif not plan.placement.found and target.is_local and os.path.isdir(target.path):
            self.experiment.clear(directory)

    def expect(self, plan: Plan, metrics: dict[str, Any]) -> None:
        """A checkpoint now persisted in the background, committed by :meth:`commit_finished`."""
        log.info("step %d: %s; %s in the background", plan.step, metrics_summary(metrics),
                 f"copying {plan.directory} to partner nodes" if plan.level == CACHE
                 else f"persisting {plan.directory}")
        self._queue.append(Entry(plan.step, metrics, plan, time.perf_counter()))

    @property
    def pending(self) -> tuple[str, ...]:
        """The checkpoints planned and not yet committed, oldest first."""
        return self.committer.directories + self._waiting

    @property
    def _waiting(self) -> tuple[str, ...]:
        """The checkpoints not yet handed to the committer: some rank still persists them."""
        return tuple(e.plan.directory for e in self._queue if e.plan and e.plan.directory)

    def commit_finished(self, announcements: list[Announcement],
                        off_collective: bool = False) -> tuple[str, ...]:
        """The background checkpoints committed since the last step, in order. Those every
        rank has now finished are committed with the metrics lines queued behind them: by the
        committer when ``off_collective`` (a later step reports them), else before this
        returns. At most one commit runs behind the ranks: a second waits for the first.
        Raises (after discarding the later ones) if one failed."""
        if not off_collective or self.committer.busy:
            self.committer.wait()
        written, failure = self.committer.newly_committed()
        if failure is not None:
            raise failure
        waiting = list(self._waiting)
        finished, failures = finished_everywhere(announcements, waiting)
        done = self._commit_ready({d: (per_rank, nodes) for d, per_rank, nodes in finished},
                                  off_collective)
        if failures:
            # Those before the failed one are committed; it and the later ones are dropped.
            for directory in waiting[len(finished):]:
                self.experiment.discard(directory)
            raise_background_failure(waiting[len(finished)], failures)
        return written + done

    def _commit_ready(self, ready: dict[str, tuple[list[Persisted], list[NodeRecords]]],
                      off_collective: bool) -> tuple[str, ...]:
        """Commit (or hand to the committer) the queue's head up to the first checkpoint not
        ``ready``; the checkpoints committed now."""
        committed = []
        while self._queue:
            entry = self._queue[0]
            if entry.plan is None:
                write, directory = partial(self._log_report, entry.step, entry.metrics), None
            elif (directory := entry.plan.directory) in ready:
                per_rank, nodes = ready[directory]
                write = (partial(self.commit_nodes, entry.plan, nodes, entry.metrics, entry.started)
                         if entry.plan.by_nodes else
                         partial(self.commit, entry.plan, per_rank, entry.metrics, entry.started))
            else:
                break
            if off_collective:
                self.committer.submit(directory, write, partial(self._dropped, directory))
            else:
                write()
                committed += [directory] if directory else []
            self._queue.popleft()
        return tuple(committed)

    def _dropped(self, directory: str | None) -> None:
        """A commit not made, after an earlier one failed."""
        if directory is not None:
            self.experiment.discard(directory)

    def ask_validation(self, directory: str, task: dict[str, Any] | None) -> None:
        """The checkpoint ``directory`` is validated once committed (``task``: None, not)."""
        if task is not None:
            self._validations[directory] = task

    def check_validations(self) -> None:
        """At each collective step: a validation whose outcome could not be recorded fails
        the step, on every rank."""
        if self.validator is not None:
            self.validator.raise_error()

    def discard(self, directory: str) -> None:
        """A checkpoint that failed before its commit."""
        self.experiment.discard(directory)

    def cached_latest(self) -> tuple[CheckpointRecord | None, list[str]]:
        """The newest checkpoint if it is in the node-local caches only, and every checkpoint
        the manifest names."""
        manifest = self.experiment.manifest
        latest = manifest.latest
        return (latest.read() if latest is not None and not latest.on_storage else None,
                [r.directory for r in manifest.checkpoints])

    def reached_storage(self, directory: str, why: str) -> None:
        """The cached checkpoint ``directory`` is complete on storage_path now: recorded so."""
        self.experiment.reached_storage(directory)
        log.info("persisted %s to storage_path (%s)", directory, why)

    def finish(self) -> None:
        """A run that finished: every validation ends before the run does."""
        if self.validator is not None:
            self.validator.finish()

    def close(self) -> None:
        """At the end of the attempt: the commits handed over are made (or given up), and
        validations still running are stopped, left pending for a resumed run."""
        self.committer.close()
        if self.validator is not None:
            self.validator.cancel()

    def commit(self, plan: Plan, per_rank: list[Persisted], metrics: dict[str, Any],
               started: float) -> None:
        """Merge what the ranks persisted (checking partner copies against it) and commit it
        in the manifest."""
        directory, index = plan.checkpoint()
        target = self.experiment.location.join(directory)
        try:
            written = merge(plan, per_rank)
            written += [hash_late(target, name) for name in unrecorded(per_rank)]
            written = attributed(plan, per_rank, written)
            check_copies(plan, per_rank)
        except (HpckitError, OSError):
            self.experiment.discard(directory)
            raise
        files = tuple(sorted(written, key=lambda r: r.path))
        self._commit(plan, CheckpointRecord(index, directory, plan.step, time.time(), metrics,
                                            files, plan.level), None, sum(f.size for f in files),
                     metrics, started)

    def commit_nodes(self, plan: Plan, nodes: list[NodeRecords], metrics: dict[str, Any],
                     started: float) -> None:
        """Commit a checkpoint whose records the node leaders wrote: the names several ranks
        hand compared across nodes, and the index of the nodes' parts written with it."""
        directory, index = plan.checkpoint()
        try:
            check_nodes(plan, nodes, self.experiment.manifest.world_size)
        except HpckitError:
            self.experiment.discard(directory)
            raise
        reference, data = indexed(directory, index, [node.part(directory) for node in nodes])
        self._commit(plan, CheckpointRecord(
            index, directory, plan.step, time.time(), metrics,
            records_of(self.experiment.location, reference), plan.level, records=reference), data,
                     sum(node.size for node in nodes), metrics, started)

    def _commit(self, plan: Plan, record: CheckpointRecord, index: bytes | None, size: int,
                metrics: dict[str, Any], started: float) -> None:
        """Commit ``record`` (``index``: the bytes of its records' index, where the node
        leaders wrote its records), asking for its validation, and say so."""
        directory = record.directory
        target = self.experiment.location.join(directory)
        asked = self._validations.pop(directory, None)
        record = replace(record, hosts=self.hosts if plan.level == CACHE else (),
                         validation=Validation.asked(asked) if asked else None)
        if not asked:  # else the validation may bring the score
            self._say_if_unscored(metrics)
        self.experiment.commit(record, self.config, index)
        count = record.records.count if record.records else len(record.files)
        if asked and self.validator is not None:
            self.validator.submit(directory)
        if self.callbacks:
            at = (self.cached_at(directory) if plan.level == CACHE and self.cached_at
                  else target)
            self.callbacks.recorded(plan.step, checkpoint_at(at))
        where = ", node-local caches" if plan.level == CACHE else ""
        if plan.asynchronous:
            log.info("step %d: committed %s (%s in %d file(s)%s), %.0f ms after its report",
                     plan.step, directory, human_size(size), count, where,
                     (time.perf_counter() - started) * 1000)
        else:
            log.info("step %d: %s; committed %s (%s in %d file(s)%s) in %.0f ms", plan.step,
                     metrics_summary(record.metrics), directory, human_size(size), count, where,
                     (time.perf_counter() - started) * 1000)

    def _log_report(self, step: int, metrics: dict[str, Any]) -> None:
        self.experiment.log_report(step, metrics)
        if self.callbacks:
            self.callbacks.recorded(step, None)

    def say_if_mixed(self, plan: Plan, announcements: list[Announcement], leveled: bool) -> None:
        """Once per run: a report made synchronous because its ranks asked for different
        upload modes (with caches, the level decides: ``Levels.leveled``)."""
        if (self._mixed_said or plan.directory is None or plan.asynchronous or plan.stop
                or leveled):
            return
        mixed = mixed_modes(announcements)
        if mixed is not None:
            self._mixed_said = True
            log.warning("step %d: %s is written synchronously: %s; give every rank that hands a "
                        "checkpoint the same checkpoint_upload_mode (said once)", plan.step,
                        plan.directory, mixed)

    def _say_if_unscored(self, metrics: dict[str, Any]) -> None:
        """Once per run: the retention's score attribute is missing from a checkpoint's
        metrics, which then ranks worst (and is the first deleted) whatever it holds."""
        attribute = self.config.checkpoint_score_attribute
        if self._score_missing_said or attribute is None or score_of(metrics, attribute) is not None:
            return
        self._score_missing_said = True
        reported = ", ".join(sorted(flatten(metrics))) or "none"
        log.warning("CheckpointConfig(checkpoint_score_attribute=%r) but a checkpoint's report "
                    "has no number by that name (its metrics: %s); such checkpoints rank worst "
                    "and are deleted first. Report %r with every checkpoint, or name one of "
                    "those.", attribute, reported, attribute)


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class _Job:
    directory: str | None  # the checkpoint it commits; None for a metrics line
    future: Future[None]


class Committer:
    """The background commits handed to the experiment's writer, in report order."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self._jobs: deque[_Job] = deque()
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
        self._jobs.append(_Job(directory, self._writer.submit(
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


class Callbacks:
    """The run's callbacks, the per-rank metrics of reports not yet recorded, and the
    recorded reports whose calls are due."""

    def __init__(self, callbacks: list[UserCallback], context: TrainRunContext) -> None:
        self.callbacks = list(callbacks)
        self.context = context
        self.error: BaseException | None = None
        self._heard: dict[int, list[dict[str, Any]]] = {}
        self._due: list[tuple[list[dict[str, Any]], Checkpoint | None]] = []
        self._noting = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def heard(self, step: int, metrics: list[dict[str, Any]]) -> None:
        """Every rank's metrics of the report at ``step`` (rank 0, when it plans it)."""
        if self.callbacks:
            with self._noting:
                self._heard[step] = metrics

    def recorded(self, step: int, checkpoint: Checkpoint | None) -> None:
        """The report at ``step`` is in the metrics log (and its checkpoint committed)."""
        with self._noting:
            metrics = self._heard.pop(step, None)
            if metrics is not None:
                self._due.append((metrics, checkpoint))

    def call_due(self) -> None:
        """Rank 0, after a collective step: ``after_report`` for each report recorded in it."""
        with self._noting:
            due, self._due = self._due, []
        for metrics, checkpoint in due:
            for callback in self.callbacks:
                if self.error is not None:
                    return
                try:
                    callback.after_report(self.context, metrics, checkpoint)
                except Exception as exc:
                    log.error("%s.after_report failed: %s", type(callback).__name__, exc,
                              exc_info=True)
                    self.error = exc

    def failed(self, worker_exceptions: dict[int, BaseException]) -> None:
        """``after_exception``; its own failure is logged, not raised over the run's."""
        for callback in self.callbacks:
            try:
                callback.after_exception(self.context, worker_exceptions)
            except Exception as exc:
                log.error("%s.after_exception failed: %s", type(callback).__name__, exc,
                          exc_info=True)
