"""hpckit: Ray Train's checkpoint and storage API on MPI, Slurm and shared storage."""

from __future__ import annotations

from hpckit.checkpoint import Checkpoint
from hpckit.config import (
    CheckpointConfig,
    CheckpointUploadMode,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    SyncConfig,
)
from hpckit.errors import (
    CheckpointError,
    CommitError,
    ConfigError,
    ExperimentLockedError,
    HpckitError,
    LaunchError,
    ManifestError,
    MetricsError,
    ReportMismatchError,
    StorageError,
    TrainingFailedError,
)
from hpckit.launch.trainer import DataParallelTrainer
from hpckit.result import Result
from hpckit.run.context import TrainContext
from hpckit.run.session import get_checkpoint, get_context, report
from hpckit.run.startup import early as _early
from hpckit.uncaught import install as _install_excepthook

_early()
_install_excepthook()

__version__ = "0.1.0"

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointUploadMode",
    "CommitError",
    "ConfigError",
    "DataParallelTrainer",
    "ExperimentLockedError",
    "FailureConfig",
    "HpckitError",
    "LaunchError",
    "ManifestError",
    "MetricsError",
    "ReportMismatchError",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "StorageError",
    "SyncConfig",
    "TrainContext",
    "TrainingFailedError",
    "get_checkpoint",
    "get_context",
    "report",
]
