"""Configuration objects (ground layer). Names and fields follow Ray Train's, so porting
means changing imports. Each is a frozen dataclass that checks itself in ``__post_init__``
and says what is wrong and what would be right.

Owns: ``scaling`` (ScalingConfig), ``checkpointing`` (CheckpointConfig,
CheckpointUploadMode), ``run`` (RunConfig, FailureConfig, SyncConfig, LoggingConfig),
``callbacks`` (UserCallback, TrainRunContext), ``validation`` (ValidationConfig,
ValidationTaskConfig, ValidationFn).
May import: :mod:`hpckit.errors`, pyarrow.
"""

from __future__ import annotations

from hpckit.config.callbacks import TrainRunContext, UserCallback
from hpckit.config.checkpointing import CheckpointConfig, CheckpointUploadMode
from hpckit.config.run import FailureConfig, LoggingConfig, RunConfig, SyncConfig
from hpckit.config.scaling import ScalingConfig
from hpckit.config.validation import ValidationConfig, ValidationFn, ValidationTaskConfig

__all__ = ["ScalingConfig", "CheckpointConfig", "CheckpointUploadMode", "FailureConfig",
           "SyncConfig", "RunConfig", "LoggingConfig", "TrainRunContext", "UserCallback",
           "ValidationConfig", "ValidationFn", "ValidationTaskConfig"]
