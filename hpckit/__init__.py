"""hpckit: Ray Train's checkpoint and storage API on MPI, Slurm and shared storage."""

from __future__ import annotations

from hpckit.checkpoint import Checkpoint
from hpckit.config import (
    CheckpointConfig,
    CheckpointUploadMode,
    FailureConfig,
    LoggingConfig,
    RunConfig,
    ScalingConfig,
    SyncConfig,
    TrainRunContext,
    UserCallback,
    ValidationConfig,
    ValidationFn,
    ValidationTaskConfig,
)
from hpckit.errors import (
    CheckpointError,
    CommitError,
    ConfigError,
    ControllerError,
    ExperimentLockedError,
    ExperimentTakenError,
    HpckitError,
    LaunchError,
    ManifestError,
    MetricsError,
    PreemptionError,
    ReportMismatchError,
    StorageError,
    TrainingFailedError,
    WorkerGroupError,
)
from hpckit.launch.trainer import DataParallelTrainer
from hpckit.result import Result
from hpckit.run.session.context import TrainContext
from hpckit.run.session.preemption import PreemptionInfo, get_preemption_info
from hpckit.run.session.session import (
    CheckpointConsistencyMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
    get_all_reported_checkpoints,
    get_checkpoint,
    get_context,
    report,
    world_rank,
)
from hpckit.run.startup.early import early as _early
from hpckit.uncaught import install as _install_excepthook

_early()
_install_excepthook()

__version__ = "0.1.0"

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "CheckpointError",
    "CheckpointUploadMode",
    "CommitError",
    "ConfigError",
    "ControllerError",
    "DataParallelTrainer",
    "ExperimentLockedError",
    "ExperimentTakenError",
    "FailureConfig",
    "HpckitError",
    "LaunchError",
    "LoggingConfig",
    "ManifestError",
    "MetricsError",
    "PreemptionError",
    "PreemptionInfo",
    "ReportMismatchError",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "StorageError",
    "SyncConfig",
    "TrainContext",
    "TrainRunContext",
    "TrainingFailedError",
    "UserCallback",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "WorkerGroupError",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_preemption_info",
    "report",
    "world_rank",
]
