"""The training session of one rank, and the module-level API that reaches it
(``hpckit.report``, ``hpckit.get_checkpoint``, ``hpckit.get_context``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hpckit import settings as _settings
from hpckit.checkpoint import Checkpoint
from hpckit.config import CheckpointUploadMode, ValidationConfig, ValidationTaskConfig
from hpckit.errors import ConfigError, HpckitError
from hpckit.experiment.artifacts import Artifacts
from hpckit.experiment.tracking import Trackers
from hpckit.logs import log
from hpckit.run.commit.protocol import CommitProtocol
from hpckit.run.ending.hang import HangWatch
from hpckit.run.ending.stop import CriterionMet, StopRequested
from hpckit.run.session.context import TrainContext
from hpckit.run.session.interval import CheckpointClock
from hpckit.run.session.resumable import Keeper, RankState
from hpckit.run.writing.staging import Upload


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
