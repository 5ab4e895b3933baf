"""The trainers' public face: ``fit()`` runs the job on this MPI world's ranks, or starts the
ranks on this node first when the script was not launched by mpirun/srun."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from hpckit import settings
from hpckit.checkpoint import Checkpoint
from hpckit.config import RunConfig, ScalingConfig, ValidationConfig
from hpckit.errors import ConfigError
from hpckit.launch import mainimport
from hpckit.launch.spawn import spawn
from hpckit.result import Result
from hpckit.run.job import Backend, TrainingJob
from hpckit.run.ranks import run_ranks


class DataParallelTrainer:
    """Run a training function on every rank of an MPI job, with hpckit's checkpoints,
    metrics, retention and resume, and no deep-learning framework set up (as in Ray Train).

    Use it for NumPy, JAX or scikit-learn jobs that coordinate through mpi4py themselves;
    :class:`hpckit.torch.TorchTrainer` adds the torch.distributed process group and devices.
    ``fit()`` works the same under ``mpirun``/``srun`` (the launched processes are the ranks)
    and from ``python train.py`` (hpckit starts ``num_workers`` ranks on this node itself).

    Ray's ``backend_config``, ``datasets``, ``dataset_config`` and ``metadata`` are not
    accepted: hpckit has no Ray Data, and its framework set-up is the trainer's class.

    Args:
        train_loop_per_worker: The training function that every rank runs: it takes
            ``train_loop_config`` as its one argument, or none.
        train_loop_config: A dict passed to the training function (and recorded with the
            experiment's config); None (the default) passes ``{}`` to a function that takes
            an argument.
        scaling_config: How many ranks and what each uses; None (the default) is
            ``ScalingConfig()``: one rank, on CPUs.
        run_config: Where the experiment is stored and how it is checkpointed and retried;
            None (the default) is ``RunConfig()``.
        resume_from_checkpoint: A checkpoint (of another run, or anywhere) that
            ``get_checkpoint()`` returns until this experiment has committed its own. None
            (the default): a new experiment starts from nothing.
        validation_config: How checkpoints reported with ``validation=`` are validated; None
            (the default): ``report(validation=...)`` is an error.

    Raises:
        ConfigError: An argument is not of the type named, or the training function takes
            more than one argument.
    """

    def __init__(self, train_loop_per_worker: Callable[..., Any], *,
                 train_loop_config: dict[str, Any] | None = None,
                 scaling_config: ScalingConfig | None = None,
                 run_config: RunConfig | None = None,
                 resume_from_checkpoint: Checkpoint | None = None,
                 validation_config: ValidationConfig | None = None) -> None:
        kind = type(self).__name__
        if not callable(train_loop_per_worker):
            raise ConfigError(f"{kind}(train_loop_per_worker={train_loop_per_worker!r}) must be "
                              "a function taking the config dict (or nothing).")
        if len(inspect.signature(train_loop_per_worker).parameters) > 1:
            raise ConfigError(f"train_loop_per_worker {train_loop_per_worker.__name__}() must take "
                              "one argument (train_loop_config) or none.")
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise ConfigError(f"{kind}(train_loop_config={train_loop_config!r}) must be a dict.")
        for name, value, expected in (("scaling_config", scaling_config, ScalingConfig),
                                      ("run_config", run_config, RunConfig),
                                      ("resume_from_checkpoint", resume_from_checkpoint, Checkpoint),
                                      ("validation_config", validation_config, ValidationConfig)):
            if value is not None and not isinstance(value, expected):
                raise ConfigError(f"{kind}({name}={value!r}) must be a {expected.__name__}.")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        self.validation_config = validation_config

    def fit(self) -> Result:
        """Train on every rank; return the :class:`Result` (on every rank under a launcher).

        Raises:
            TrainingFailedError: Training failed after any restarts ``FailureConfig``
                allows: a ``WorkerGroupError`` naming each failed rank's exception, or a
                ``ControllerError`` where a ``UserCallback`` or hpckit itself failed.
            PreemptionError: The job was told to end and was not requeued.
            ExperimentLockedError: Another live run holds the experiment
                (``ExperimentTakenError`` where one took it over from this run).
            LaunchError: The ranks could not be started, or the launched world disagrees
                with ``scaling_config``.
            ConfigError: A setting is invalid (the storage path, an environment variable).
        """
        if mainimport.importing_main:
            raise mainimport.MainImported()
        current = settings.refresh()
        job = self.training_job()
        if current.launcher is None and job.launched_ranks > 1:
            return spawn(job, current)
        return run_ranks(job, current)

    def training_job(self) -> TrainingJob:
        """What ``fit()`` runs on every rank (a sweep runs it on a group of the ranks)."""
        return TrainingJob(self.train_loop_per_worker, self.train_loop_config,
                           self.scaling_config, self.run_config, self.resume_from_checkpoint,
                           self._backend(), self.validation_config)

    def _backend(self) -> Backend:
        """The framework set up on every rank before the training function: none here."""
        return Backend()
