"""One trial: the trainer that runs it, on the sweep's storage, under its own directory."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from hpckit import settings
from hpckit.config import RunConfig, ScalingConfig
from hpckit.errors import ConfigError, ManifestError
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.reading import read_metrics, require_manifest
from hpckit.launch.trainer import DataParallelTrainer
from hpckit.result import Result
from hpckit.run.ranks import run_ranks
from hpckit.storage.location import Location
from hpckit.sweep.trainable import ClassRunner
from hpckit.sweep.trainable import Trainable as TuneTrainable

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

Trainable = Callable[..., Any] | DataParallelTrainer


def check_trainable(trainable: Any) -> None:
    if isinstance(trainable, DataParallelTrainer) or callable(trainable):
        return
    raise ConfigError(f"Tuner({trainable!r}) needs a training function (one rank per trial) "
                      "or a TorchTrainer/DataParallelTrainer (its ScalingConfig's ranks per "
                      "trial; param_space goes into its train_loop_config).")


def prepared(trainable: Any, run_config: RunConfig) -> Trainable:
    """A ``tune.Trainable`` class as a training function, checkpointing as
    ``CheckpointConfig(checkpoint_frequency, checkpoint_at_end)`` say; others as given."""
    if isinstance(trainable, type) and issubclass(trainable, TuneTrainable):
        config = run_config.checkpoint_config
        return ClassRunner(trainable, config.checkpoint_frequency,
                           bool(config.checkpoint_at_end), run_config.stop)
    return cast(Trainable, trainable)


def ranks_per_trial(trainable: Trainable) -> int:
    if isinstance(trainable, DataParallelTrainer):
        return trainable.scaling_config.max_workers
    return 1


def trial_run_config(base: RunConfig, sweep: Location, dirname: str) -> RunConfig:
    """The sweep's RunConfig for one trial: its directory under the sweep's."""
    return replace(base, name=dirname, storage_path=sweep.path,
                   storage_filesystem=None if sweep.is_local else sweep.filesystem)


def run_trial(trainable: Trainable, params: dict[str, Any], run_config: RunConfig,
              group: Comm | None = None) -> Result:
    """Train one trial, on the ranks of ``group`` (a communicator) or as ``fit()`` does; a
    failure raises as fit() raises it."""
    if isinstance(trainable, DataParallelTrainer):
        trainer = copy.copy(trainable)
        trainer.train_loop_config = {**(trainable.train_loop_config or {}), **params}
        trainer.run_config = run_config
    else:
        trainer = DataParallelTrainer(trainable, train_loop_config=params,
                                      scaling_config=ScalingConfig(num_workers=1),
                                      run_config=run_config)
    if group is None:
        return trainer.fit()
    return run_ranks(trainer.training_job(), settings.refresh(), group)


def finished(directory: Location) -> dict[str, Any] | None:
    """The last metrics of the trial in ``directory`` if its run finished, else None."""
    try:
        manifest = require_manifest(directory)
    except ManifestError:
        return None
    last = manifest.last_attempt
    if last is None or last.status is not AttemptStatus.FINISHED:
        return None
    history = read_metrics(directory)
    return history[-1]["metrics"] if history else {}
