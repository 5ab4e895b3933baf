"""One trial: the trainer that runs it, on the sweep's storage, under its own directory."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hpckit.config import RunConfig, ScalingConfig
from hpckit.errors import ConfigError
from hpckit.launch.trainer import DataParallelTrainer
from hpckit.result import Result
from hpckit.storage.location import Location

Trainable = Callable[..., Any] | DataParallelTrainer


def check_trainable(trainable: Any) -> None:
    if isinstance(trainable, DataParallelTrainer) or callable(trainable):
        return
    raise ConfigError(f"Tuner({trainable!r}) needs a training function (one rank per trial) "
                      "or a TorchTrainer/DataParallelTrainer (its ScalingConfig's ranks per "
                      "trial; param_space goes into its train_loop_config).")


def ranks_per_trial(trainable: Trainable) -> int:
    if isinstance(trainable, DataParallelTrainer):
        return trainable.scaling_config.num_workers
    return 1


def trial_run_config(base: RunConfig, sweep: Location, dirname: str) -> RunConfig:
    """The sweep's RunConfig for one trial: its directory under the sweep's."""
    return replace(base, name=dirname, storage_path=sweep.path,
                   storage_filesystem=None if sweep.is_local else sweep.filesystem)


def run_trial(trainable: Trainable, params: dict[str, Any], run_config: RunConfig) -> Result:
    """Train one trial; a failure raises as fit() raises it."""
    if isinstance(trainable, DataParallelTrainer):
        trainer = copy.copy(trainable)
        trainer.train_loop_config = {**(trainable.train_loop_config or {}), **params}
        trainer.run_config = run_config
    else:
        trainer = DataParallelTrainer(trainable, train_loop_config=params,
                                      scaling_config=ScalingConfig(num_workers=1),
                                      run_config=run_config)
    return trainer.fit()
