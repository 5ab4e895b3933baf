"""One attempt of a run on every rank: open the experiment (rank 0), check the storage is
shared, set up the back-end, run the training function with a session, and end the attempt.

The end of a run that a stop request stopped, after the checkpoint that followed it:
requeued under Slurm and exit 75, or ``PreemptionError`` on every rank, as Ray raises.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.fs

from hpckit import exits, uncaught
from hpckit.checkpoint import checkpoint_at, location_of
from hpckit.config.callbacks import TrackerCallback, TrainRunContext
from hpckit.errors import AttemptFailed, ExperimentTakenError, PreemptionError, StorageError
from hpckit.experiment import retention
from hpckit.experiment.artifacts import Artifacts
from hpckit.experiment.attempts import Attempt, AttemptStatus, previous_failure
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.manifest import Manifest
from hpckit.experiment.opening import Opening
from hpckit.logs import log
from hpckit.result import Result, result_of
from hpckit.run.commit.coordinator import Callbacks
from hpckit.run.commit.protocol import CommitProtocol
from hpckit.run.ending import stop
from hpckit.run.ending.hang import HangWatch
from hpckit.run.job import TrainingJob, command_record
from hpckit.run.levels import restore
from hpckit.run.levels.levels import Levels
from hpckit.run.mpi.comm import everywhere, failed_ranks, on_root, raised_together
from hpckit.run.mpi.group import Group
from hpckit.run.mpi.waiting import from_root
from hpckit.run.session.context import TrainContext
from hpckit.run.session.preemption import not_requeued_after, preemption_info
from hpckit.run.session.resumable import RankState
from hpckit.run.session.session import CheckpointClock, Session, activate, agreed_due
from hpckit.run.startup.early import ready_since
from hpckit.run.validation.pool import Pool
from hpckit.run.validation.validator import for_attempt
from hpckit.run.writing.staging import Staging
from hpckit.settings import Settings
from hpckit.storage import files
from hpckit.storage.location import Location, local
from hpckit.storage.uris import redact

Leveled = tuple[Levels | None, restore.Restored]  # the attempt's levels, what it restarts from


@dataclass(frozen=True)
class Start:
    """What every rank learns from rank 0 when the experiment is open."""

    latest: str | None
    next_step: int
    next_index: int
    marker: str
    recorded_number: int  # the attempt's number in the manifest, across every run


@dataclass(frozen=True)
class Ranks:
    """The ranks an attempt runs on."""

    group: Group
    validation: Pool | None = None
    """The ranks set aside to validate, beside this world."""


def run_attempt(job: TrainingJob, ranks: Ranks, settings: Settings, number: int) -> Result:
    comm = ranks.group.world
    began = time.time()
    root = job.storage_root(settings)
    location = root.join(job.name)
    levels, restored = restore.prepare(comm, job.run_config.checkpoint_config, location)
    experiment, start = on_root(comm, lambda: _open(job, root, comm.size, settings, number,
                                               restored.directory),
                           f"opening experiment {location.display}", StorageError)
    try:
        session = _start(job, ranks, settings, number, location, start, experiment, began,
                         (levels, restored))
        returned = _train(job, session, experiment, settings)
        summary = None
        if experiment is not None:
            experiment.end_attempt(AttemptStatus.FINISHED, None, session.protocol.reports)
            summary = (experiment.manifest, experiment.history(), sendable(returned))
        manifest, history, returned = from_root(comm, summary)
        return result_of(location, manifest, history, returned)
    except KeyboardInterrupt:
        opened, experiment = experiment, None
        if opened is not None:
            opened.close(promptly=True)
        raise
    finally:
        if experiment is not None:
            experiment.close()


def _open(job: TrainingJob, root: Location, world_size: int, settings: Settings,
          number: int, restored: str | None) -> tuple[Experiment, Start]:
    """Rank 0: open the experiment and leave a marker that every rank must see."""
    config = job.run_config.checkpoint_config
    attempt = Attempt(number, AttemptStatus.RUNNING, time.time(), world_size,
                      settings.launcher or "python", socket.gethostname(), os.getpid(),
                      tuple(redact(a) for a in sys.argv), settings.slurm())
    started = Manifest(job.name, world_size, command_record(settings), job.config_record(root),
                       retention.record(config), time.time())
    opening = Opening(started, config.verify_on_resume, attempt,
                      previous_failure(settings), restored, *job.trackers(root))
    experiment = Experiment.open(root, opening, settings, job.run_config.sync_config)
    try:
        job.warn_if_meant_to_resume(root, experiment.manifest)
        marker = experiment.leave_marker()
    except BaseException:
        experiment.close()
        raise
    latest = experiment.manifest.latest
    last = experiment.manifest.last_attempt
    return experiment, Start(latest.directory if latest else None, experiment.manifest.next_step,
                        experiment.manifest.next_checkpoint_index, marker,
                        last.attempt if last else 0)


def _check_shared(group: Group, location: Location, marker: str,
                  experiment: Experiment | None) -> None:
    topology = group.topology

    def visible() -> None:
        if files.file_type(location.join(marker)) != pyarrow.fs.FileType.File:
            raise StorageError(
                f"rank {topology.world_rank} on {topology.hostname} cannot see "
                f"{location.display} as rank 0 wrote it: the storage path is not shared by every "
                "node (a node-local path such as /tmp in a multi-node job?). Use a shared "
                "filesystem (Lustre, NFS) or S3.")

    everywhere(group.world, visible, "checking that every rank sees the storage", StorageError)
    if experiment is not None:
        experiment.remove_marker(marker)


def _start(job: TrainingJob, ranks: Ranks, settings: Settings, number: int,
           location: Location, start: Start, experiment: Experiment | None, began: float,
           leveled: Leveled) -> Session:
    """Everything between opening the experiment and the first step; an error here ends
    the attempt as failed (interrupted, for Ctrl-C) with its message, on every rank alike."""
    try:
        with stop.ending_at_sigterm(settings.stop_signal):
            if ranks.group.topology.local_rank == 0:  # before any rank removes its staging
                Staging(location, ranks.group.rank, settings.local_dir).put_back_local(
                    start.next_index)
            _check_shared(ranks.group, location, start.marker, experiment)
            job.backend.setup(ranks.group, job.scaling_config, settings)
            session = _session(job, ranks, settings, number, location, start, experiment,
                               leveled)
    except BaseException as exc:
        if isinstance(exc, stop.TerminatedAtStartUp):
            log.warning("%s", exc)
        if experiment is not None:
            experiment.end_attempt(_ending(exc), f"{type(exc).__name__} at start-up: {exc}", 0)
        raise
    since, counted = ready_since(settings, began)
    log.info("%d rank(s) on %d node(s) ready in %.2f s %s; experiment %s",
             ranks.group.size, ranks.group.topology.num_nodes, time.time() - since, counted,
             location.display)
    return session


def _ending(exc: BaseException) -> AttemptStatus:
    return AttemptStatus.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else AttemptStatus.FAILED


def _session(job: TrainingJob, ranks: Ranks, settings: Settings, number: int,
             location: Location, start: Start, experiment: Experiment | None,
             leveled: Leveled) -> Session:
    rank = ranks.group.rank
    sync = job.run_config.sync_config
    artifacts = Artifacts(location, rank, settings.local_dir,
                          sync.sync_artifacts and (rank == 0 or sync.sync_artifacts_all_ranks))
    levels, restored = leveled
    latest = (checkpoint_at(local(restored.path)) if restored.path and start.latest == restored.directory
              else checkpoint_at(location.join(start.latest)) if start.latest else None)
    staging = Staging(location, rank, settings.local_dir)
    staging.remove()  # what an earlier attempt of this rank left
    protocol = CommitProtocol(ranks.group, location, job.run_config.checkpoint_config,
                              (start.next_step, start.next_index), experiment, latest, staging,
                              callbacks(job, location), job.run_config.stop, levels,
                              for_attempt(job, experiment, settings, ranks.validation))
    context = TrainContext(ranks.group.topology, job.name, location, number, settings.launcher,
                           settings.slurm(), artifact_dir=lambda: artifacts.directory,
                           stop_requested=lambda: session.stop_requested is not None,
                           checkpoint_dir=protocol.checkpoint_dir,
                           checkpoint_due=lambda: agreed_due(
                               ranks.group.world, clock, lambda: session.stop_requested is not None))
    watch = HangWatch(job.run_config.failure_config.hang_timeout_s, location, start.recorded_number, rank)
    clock = CheckpointClock(job.run_config.checkpoint_config.mtbf_s)
    rank_state = RankState(rank, ranks.group.size, location_of(latest) if latest else None,
                           job.run_config.checkpoint_config.exact_resume, job.backend.keepers(),
                           ranks.group.members[0] if ranks.group.members else rank)
    session = Session(context, protocol, job.resume_from_checkpoint, artifacts, watch, clock,
                      rank_state, job.validation_config)
    return session


def callbacks(job: TrainingJob, location: Location) -> Callbacks:
    """The run's UserCallbacks with what they are told of the run."""
    context = TrainRunContext(job.run_config, job.train_loop_config or {}, job.scaling_config,
                              location.display)
    return Callbacks([c for c in job.run_config.callbacks or []  # trackers: the experiment's
                      if not isinstance(c, TrackerCallback)], context)


def _train(job: TrainingJob, session: Session, experiment: Experiment | None,
           settings: Settings) -> Any:
    """Run the training function; what it returned."""
    activate(session)
    interrupted = taken = False
    ended = AttemptStatus.FINISHED  # as the runs that setup_mlflow/setup_wandb started end
    try:
        with session.watch:
            try:
                returned = job.call_train_loop()
            except stop.CriterionMet:  # RunConfig(stop=...): done, as if it had returned
                returned = None
            session.protocol.returned()
        return returned
    except stop.StopRequested as requested:
        ended = AttemptStatus.STOPPED
        end_stopped_run(job, session, experiment, settings, str(requested))
    except KeyboardInterrupt:
        stop.exit_on_next_interrupt()
        interrupted, ended = True, AttemptStatus.INTERRUPTED
        if experiment is not None:
            experiment.end_attempt(AttemptStatus.INTERRUPTED, "interrupted by SIGINT (Ctrl-C)",
                              session.protocol.reports)
            if not settings.worker:  # else the process that started the ranks says it
                latest = experiment.manifest.latest
                log.warning("%s", stop.interrupted_line(
                    experiment.location, latest.directory if latest else None, not job.timestamped))
        raise
    except BaseException as exc:
        together, ended = raised_together(exc), AttemptStatus.FAILED
        taken = isinstance(exc, ExperimentTakenError)
        if experiment is not None:
            experiment.end_attempt(AttemptStatus.FAILED, f"{type(exc).__name__}: {exc}",
                              session.protocol.reports)
            session.protocol.callbacks.failed(failed_ranks(exc) or {0: exc})
        raise AttemptFailed(exc, together) from exc
    finally:
        activate(None)
        session.tracked.end(ended)
        session.rank_state.close()
        # A run whose experiment another run took writes nothing more there: its staging and
        # artifacts may be the other run's now (the same ranks' names).
        session.protocol.close(promptly=interrupted or taken)
        session.artifacts.close(sync=not taken)


def sendable(value: Any) -> Any:
    """Rank 0's return value if it can be sent to the other ranks (pickled), else None."""
    try:
        pickle.dumps(value)
    except Exception as exc:
        log.warning("the training function's return value cannot be pickled (%s); "
                    "Result.return_value is None", exc)
        return None
    return value


def end_stopped_run(job: TrainingJob, session: Session, experiment: Experiment | None,
              settings: Settings, signal_name: str) -> None:
    """After the checkpoint that followed a stop request: requeue under Slurm (up to
    FailureConfig.max_preemption_failures times) and exit 75; not requeued, raise
    PreemptionError on every rank (as Ray does), which exits 75 if uncaught."""
    limit = job.run_config.failure_config.max_preemption_failures
    requeued = False
    if experiment is not None:
        reason = f"stop requested by {signal_name}"
        reports = session.protocol.reports
        requeue = settings.job_to_requeue
        before = sum(a.status is AttemptStatus.REQUEUED for a in experiment.manifest.attempts)
        refused = requeue and not_requeued_after(signal_name, settings)
        if refused:
            requeue = None
            reason += f"; not requeued: {refused}"
        elif requeue and limit != -1 and before >= limit:
            requeue = None
            reason += (f"; not requeued: FailureConfig(max_preemption_failures={limit}) reached "
                       f"after {before} requeue(s)")
        # Recorded before asking: Slurm may end this job as soon as it requeues it.
        experiment.end_attempt(AttemptStatus.REQUEUED if requeue else AttemptStatus.STOPPED, reason, reports)
        requeued = bool(requeue) and stop.requeue(settings)
        if not requeued:
            if requeue:
                experiment.end_attempt(AttemptStatus.STOPPED, reason, reports)
            latest = session.protocol.latest
            log.warning("stopped after committing %s (%s). To continue, %s",
                        latest.uri if latest else "-", reason,
                        stop.how_to_resume(experiment.location.display, not job.timestamped))
    comm = session.protocol.comm
    if from_root(comm, requeued):
        raise SystemExit(exits.STOPPED)
    raise uncaught.shown_elsewhere(PreemptionError(preemption_info(comm, session, settings)))
