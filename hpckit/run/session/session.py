"""The training session of one rank, and the module-level API that reaches it
(``hpckit.report``, ``hpckit.get_checkpoint``, ``hpckit.get_context``).

``get_all_reported_checkpoints()`` and its types, as in Ray Train 2.60.

``get_context().should_checkpoint()``: how often to checkpoint, by Young and Daly.

A checkpoint that blocks training for C seconds, on a job whose mean time between failures
is M, costs the least (checkpoint time plus work lost to failures) when taken every
τ = √(2·C·M) seconds (Young 1974; Daly 2006 adds terms that matter only when C is a large
part of M). hpckit measures C on each checkpointed ``report()`` (the time it blocked: the
hand-over for an asynchronous one), takes the median of the last few, and M from
``CheckpointConfig(mtbf_s=...)``. Expected work lost per failure is about τ/2 + C.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from hpckit import settings as _settings
from hpckit.checkpoint import Checkpoint, checkpoint_at
from hpckit.config import CheckpointUploadMode, ValidationConfig, ValidationTaskConfig
from hpckit.errors import ConfigError, HpckitError
from hpckit.experiment import retention
from hpckit.experiment.artifacts import Artifacts
from hpckit.experiment.manifest import CheckpointRecord
from hpckit.experiment.reading import require_manifest
from hpckit.experiment.tracking import Trackers
from hpckit.logs import log
from hpckit.run.commit.planning import check_agreed
from hpckit.run.commit.protocol import CommitProtocol
from hpckit.run.ending import stop
from hpckit.run.ending.hang import HangWatch
from hpckit.run.ending.stop import CriterionMet, StopRequested
from hpckit.run.mpi.comm import all_reduce
from hpckit.run.mpi.waiting import quiet_everywhere
from hpckit.run.session.context import TrainContext
from hpckit.run.session.resumable import Keeper, RankState
from hpckit.run.writing.staging import Upload
from hpckit.storage.location import Location


@dataclass
class Session:
    """What lives for one attempt of one rank."""

    context: TrainContext
    protocol: CommitProtocol
    seed: Checkpoint | None
    artifacts: Artifacts
    watch: HangWatch
    clock: CheckpointClock
    rank_state: RankState
    validation_config: ValidationConfig | None = None
    # tracker runs the training function started (setup_mlflow, setup_wandb): they end as
    # the attempt ends
    tracked: Trackers = field(default_factory=lambda: Trackers({}))

    def validation(self, asked: bool | ValidationTaskConfig,
                   checkpoint: Checkpoint | None) -> dict[str, Any] | None:
        """What ``report(validation=asked)`` asks, merged over the trainer's defaults."""
        if asked is False:
            return None
        if checkpoint is None:
            raise ConfigError("report(validation=...) validates the checkpoint it reports: "
                              "pass checkpoint=... too, as in Ray.")
        if self.validation_config is None:
            raise ConfigError("report(validation=...) but the trainer has no validation_config; "
                              "pass TorchTrainer(..., validation_config=ValidationConfig(fn)).")
        return self.validation_config.task(asked)

    @property
    def stop_requested(self) -> str | None:
        """The stop the ranks agreed on (its signal's name), kept by the commit protocol."""
        return self.protocol.stop

    def report(self, metrics: Any, checkpoint: Checkpoint | None, upload: Upload) -> None:
        already = self.stop_requested
        began = time.perf_counter()
        outcome = self.protocol.report(metrics, checkpoint, upload)
        self.clock.reported(None if checkpoint is None else time.perf_counter() - began)
        self.watch.progressed()
        self.artifacts.sync()
        stop = self.stop_requested
        if stop and not already and self.context.get_world_rank() == 0:
            log.warning("stop requested (%s): the run stops after its next committed "
                        "checkpoint", stop)
        if stop and outcome.committed is not None:
            raise StopRequested(stop)
        if outcome.criterion_met:
            if self.context.get_world_rank() == 0:  # a sweep's scheduler says why it decided
                said = getattr(self.protocol.stop_when, "said", "RunConfig(stop=...) is met")
                log.info("%s: the run ends after this report", said)
            raise CriterionMet()


_current: Session | None = None


def activate(session: Session | None) -> None:
    global _current
    _current = session


def current(caller: str) -> Session:
    if _current is None:
        raise HpckitError(
            f"hpckit.{caller}() was called outside a training run; call it inside the training "
            "function passed to TorchTrainer(...) (or DataParallelTrainer), which fit() runs on "
            "every rank.")
    return _current


def keep_loader(loader: Keeper) -> str:
    """Keep a prepared loader's position with this rank's checkpoints (outside a training
    run: nothing to keep it for); the name it is kept under (``loader-0`` for the first)."""
    if _current is not None:
        return _current.rank_state.keep_loader(loader)
    return "a prepared loader"


def get_context() -> TrainContext:
    """This rank's :class:`TrainContext`: ranks, topology, experiment, stop requests.

    Raises:
        HpckitError: Called outside a training run.
    """
    return current("get_context").context


def world_rank() -> int:
    """This process's rank among the ranks its launcher started (mpiexec, srun), read from
    the launcher's environment: usable outside the training function, before MPI is up and
    after ``fit()`` returned, e.g. to print a Result once. 0 in a process that runs alone,
    such as ``python train.py`` that starts its ranks itself."""
    rank = _settings.current().launched_rank
    return int(rank) if rank.isdigit() else 0


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint (on resume), else ``resume_from_checkpoint``, else None.

    The first call of a resumed run also restores this rank's random streams and its
    loaders' positions as they were when that checkpoint was reported
    (``CheckpointConfig(exact_resume=True)``, the default): call it once the model and
    loaders are built, right before the training loop.

    Raises:
        HpckitError: Called outside a training run.
    """
    session = current("get_checkpoint")
    session.rank_state.restore()
    return session.protocol.latest or session.seed


def report(metrics: dict[str, Any], checkpoint: Checkpoint | None = None, *,
           checkpoint_dir_name: str | None = None,
           checkpoint_upload_mode: CheckpointUploadMode | str = CheckpointUploadMode.SYNC,
           delete_local_checkpoint_after_upload: bool | None = None,
           checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
           validation: bool | ValidationTaskConfig = False) -> None:
    """Record rank 0's metrics and persist every rank's checkpoint files as one checkpoint.

    Collective: every rank calls it the same number of times. With ``SYNC`` it returns once
    the checkpoint is committed in the manifest, and raises the same error on every rank when
    it could not be. With ``ASYNC`` it returns once the files are handed over (the directory
    may then be deleted); they are persisted in the background and committed at a later
    report, when the training function returns, or when a stop is agreed; a failure is raised
    on every rank there.

    Args:
        metrics: This report's metrics: JSON values (numbers, strings, booleans, None, and
            lists and dicts of them). Rank 0's are recorded; the other ranks' are not, as in
            Ray.
        checkpoint: This rank's files for the checkpoint, or None when this rank hands none
            (a report where every rank passes None records metrics only). Any rank may hand a
            directory; all of them become one checkpoint.
        checkpoint_dir_name: The checkpoint's directory in the experiment, the same on every
            rank. None (the default) names it ``checkpoint_NNNNNN``. Two reports that name the
            same directory are an error (Ray merges them).
        checkpoint_upload_mode: ``SYNC`` (the default), ``ASYNC`` or ``NO_UPLOAD``, or its
            name as a string. ``NO_UPLOAD`` commits the files already written in place into
            ``get_context().get_checkpoint_dir()``, synchronously. The mode is taken from the
            ranks that hand a checkpoint; where they ask for different ones, the report is
            synchronous.
        delete_local_checkpoint_after_upload: True lets hpckit move the handed files instead
            of copying them, and remove the handed directory; False keeps it. None (the
            default) means True for ``ASYNC`` only, as in Ray.
        checkpoint_upload_fn: ``fn(checkpoint, checkpoint_dir_name) -> Checkpoint`` that
            uploads this rank's files itself, straight into the checkpoint's directory
            ``<experiment>/<checkpoint_dir_name>`` (on POSIX or S3 storage), and returns a
            checkpoint of that directory (Ray allows anywhere in the run's storage; hpckit
            refuses anything else). Once every rank's has returned, hpckit hashes (reading
            back), records and commits what it finds there, as for a checkpoint written in
            place. With ``ASYNC`` it runs on the background thread and must not run
            collectives on the training's process group; with ``NO_UPLOAD`` it is not called.
            None (the default): hpckit writes the files.
        validation: True, or a ``ValidationTaskConfig`` whose ``fn_kwargs`` are merged over
            the trainer's, has the trainer's ``ValidationConfig.fn`` validate this checkpoint
            once it is committed, in a process of its own on rank 0's node, while training
            goes on; rank 0's report decides. Needs ``checkpoint``. False (the default)
            validates nothing.

    Raises:
        ConfigError: An argument is invalid, or ``validation`` is asked without a checkpoint
            or without the trainer's ``validation_config``.
        MetricsError: This rank's metrics cannot be stored as JSON (the message names
            the key).
        CommitError: The checkpoint could not be committed (``ReportMismatchError`` when the
            ranks called ``report()`` different numbers of times); raised on every rank.
        HpckitError: Called outside a training run.
    """
    if checkpoint_upload_fn is not None and not callable(checkpoint_upload_fn):
        raise ConfigError(f"report(checkpoint_upload_fn={checkpoint_upload_fn!r}) must be a "
                          "function (checkpoint, checkpoint_dir_name) -> Checkpoint.")
    session = current("report")
    mode = CheckpointUploadMode.parse(checkpoint_upload_mode)
    delete = delete_local_checkpoint_after_upload
    if delete is None:
        delete = mode.default_delete_local_checkpoint_after_upload()
    elif not isinstance(delete, bool):
        raise ConfigError(f"report(delete_local_checkpoint_after_upload={delete!r}) must be True, "
                          "False or None (Ray's default: True for ASYNC, else False).")
    keeper = session.rank_state
    session.report(metrics, checkpoint, Upload(mode, delete, checkpoint_dir_name,
                                                session.validation(validation, checkpoint),
                                                checkpoint_upload_fn,
                                                keeper.capture if keeper.enabled else None,
                                                keeper.enabled and bool(keeper.keepers)))


class ReportedCheckpointStatus(Enum):
    """Where a reported checkpoint stands: ``COMMITTED`` (no validation asked), or its
    validation's status as the manifest records it."""

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


class CheckpointConsistencyMode(Enum):
    """What :func:`get_all_reported_checkpoints` waits for: the commits (``COMMITTED``), or
    also the end of every validation (``VALIDATED``)."""

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


@dataclass(frozen=True)
class ReportedCheckpoint:
    """A committed checkpoint with its metrics (a validation's merged in) and status.

    Args:
        checkpoint: The committed checkpoint, in the experiment's directory.
        metrics: Its report's metrics as the manifest stores them (JSON values), with a
            validation's metrics merged over them.
        status: ``COMMITTED`` (the default) where no validation was asked, else the
            validation's status.
    """

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus = ReportedCheckpointStatus.COMMITTED


POLL_S = 0.2


def get_all_reported_checkpoints(
        consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
        timeout_s: float | None = None) -> list[ReportedCheckpoint]:
    """Every checkpoint of this experiment that is kept, this run's and those of the runs it
    resumed, worst to best by the retention score (best last; report order without a score).

    Any rank may call it, any number of times: it reads the manifest, which every rank sees.
    A synchronous report's checkpoint is listed once ``report()`` has returned; an
    asynchronous one once it is committed (at a later report, or at the end of the run).
    With ``VALIDATED`` (the default, as in Ray) it first waits until no kept checkpoint
    awaits validation, or ``timeout_s`` has passed (then it returns what stands, as Ray
    does); rank 0's validation thread records each outcome while the ranks train.

    Args:
        consistency_mode: ``VALIDATED`` (the default) waits for every kept checkpoint's
            validation to end; ``COMMITTED`` lists the committed checkpoints at once.
        timeout_s: With ``VALIDATED``, the most seconds to wait; None (the default) waits
            as long as a validation is pending. Ignored with ``COMMITTED``.

    Returns:
        The kept checkpoints, worst to best.

    Raises:
        ConfigError: ``consistency_mode`` is not a ``CheckpointConsistencyMode``.
        ManifestError: The experiment's manifest cannot be read.
        HpckitError: Called outside a training run.
    """
    if not isinstance(consistency_mode, CheckpointConsistencyMode):
        raise ConfigError(f"get_all_reported_checkpoints(consistency_mode={consistency_mode!r}) "
                          "must be a CheckpointConsistencyMode (COMMITTED or VALIDATED).")
    location: Location = current("get_all_reported_checkpoints").context.experiment
    manifest = require_manifest(location)
    if consistency_mode is CheckpointConsistencyMode.VALIDATED:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while manifest.awaiting_validation and (deadline is None or time.monotonic() < deadline):
            time.sleep(POLL_S)
            manifest = require_manifest(location)
    return [ReportedCheckpoint(checkpoint_at(location.join(r.directory)), r.metrics, _status(r))
            for r in reversed(retention.ranked(manifest))]


def _status(record: CheckpointRecord) -> ReportedCheckpointStatus:
    if record.validation is None:
        return ReportedCheckpointStatus.COMMITTED
    return ReportedCheckpointStatus(record.validation.status)


if TYPE_CHECKING:
    from mpi4py.MPI import Comm

MEASURED = 5  # blocking times the median is taken over


def optimal_interval(cost_s: float, mtbf_s: float) -> float:
    """Young/Daly's interval in seconds: √(2·C·M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


class CheckpointClock:
    """One rank's record of its checkpoints' blocking times and of its last commit."""

    def __init__(self, mtbf_s: float) -> None:
        self.mtbf_s = mtbf_s
        self.committed_at = time.monotonic()
        self.costs: deque[float] = deque(maxlen=MEASURED)
        self._said: float | None = None

    def reported(self, blocked_s: float | None) -> None:
        """A report returned: it blocked for ``blocked_s`` with a checkpoint (None without).
        The interval counts from there, not from the commit of an asynchronous one, which
        comes later."""
        if blocked_s is not None:
            self.costs.append(blocked_s)
            self.committed_at = time.monotonic()

    def due(self) -> tuple[bool, float | None]:
        """Whether the interval has passed since the last commit, and the interval (None
        until a checkpoint was measured: then it is due, to measure one)."""
        if not self.costs:
            return True, None
        interval = optimal_interval(statistics.median(self.costs), self.mtbf_s)
        return time.monotonic() - self.committed_at >= interval, interval

    def say(self, interval: float) -> None:
        """Log the interval when it is first known and when it moves by a quarter."""
        if self._said is not None and abs(interval - self._said) <= 0.25 * self._said:
            return
        self._said = interval
        cost = statistics.median(self.costs)
        log.info("checkpoint interval %.0f s (Young/Daly: blocking cost %.2f s, "
                 "CheckpointConfig(mtbf_s=%.0f)); expected work lost per failure about %.0f s",
                 interval, cost, self.mtbf_s, interval / 2 + cost)


def agreed_due(comm: Comm, clock: CheckpointClock, stopping: Callable[[], bool]) -> bool:
    """``should_checkpoint()``: True when Young/Daly's interval has passed since the last
    checkpointed report (by rank 0's clock, so every rank gets the same answer), when no
    checkpoint has been measured yet, or when a stop was requested on any rank. Collective:
    each rank sends whether it heard a stop; rank 0 decides."""
    def decide(heard: list[bool]) -> bool:
        check_agreed(heard, bool, "get_context().should_checkpoint()")
        due, interval = clock.due()
        if interval is not None:
            clock.say(interval)
        return due or any(heard)

    quiet_everywhere(comm, -1, False)  # as report() starts: a rank in report() meets it here
    return all_reduce(comm, "get_context().should_checkpoint()",
                      lambda: stop.received() is not None or stopping(), decide, HpckitError)
