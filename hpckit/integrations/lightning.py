"""PyTorch Lightning on hpckit's ranks, as Ray Train's ``ray.train.lightning`` offers it: the
cluster environment (Lightning's view of the job, taken from hpckit), the DDP and FSDP
strategies on hpckit's process group and devices, the report callback that commits
Lightning's checkpoints through ``hpckit.report()``, and ``prepare_trainer``, which refuses a
Trainer that would fight hpckit with what to change. Public names in :mod:`hpckit.lightning`;
the ``lightning`` package is an optional extra (``pip install -e '.[lightning]'`` in hpckit's
clone) that only this module imports."""

from __future__ import annotations

import os
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from lightning.pytorch.utilities.warnings import PossibleUserWarning

import hpckit
from hpckit.checkpoint import Checkpoint
from hpckit.errors import ConfigError
from hpckit.integrations.torch.distributed import device
from hpckit.logs import log
from hpckit.writes import claim

EXPECTED = ("pl.Trainer(strategy=RayDDPStrategy() (or RayFSDPStrategy() on GPUs), "
            "plugins=[RayLightningEnvironment()], devices=1, "
            "callbacks=[RayTrainReportCallback()], ...), all from hpckit.lightning")


class RayLightningEnvironment(LightningEnvironment):
    """Ranks, world size and node rank from hpckit's context, so that Lightning starts no
    processes and does not take the job for one of its own (``SLURMEnvironment`` under
    ``srun`` would). The torch process group is hpckit's, joined before the training
    function runs; Lightning finds it initialized and uses it."""

    def __init__(self) -> None:
        super().__init__()
        # Lightning's hint to "prepend srun" whenever srun exists is wrong here: hpckit's ranks
        # come from srun, mpirun or hpckit itself, and this environment takes them as they are.
        warnings.filterwarnings("ignore", message="The `srun` command is available",
                                category=PossibleUserWarning)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return hpckit.get_context().get_world_size()

    def global_rank(self) -> int:
        return hpckit.get_context().get_world_rank()

    def local_rank(self) -> int:
        return hpckit.get_context().get_local_rank()

    def node_rank(self) -> int:
        return hpckit.get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """hpckit's world size is the truth; Lightning's own count is not kept."""

    def set_global_rank(self, rank: int) -> None:
        """hpckit's rank is the truth; Lightning's own count is not kept."""

    def teardown(self) -> None:
        """The process group is hpckit's: it ends it with the run."""


class _OnHpckitRanks:
    """A strategy's device is the one hpckit gave this rank, and its samplers split the data
    over hpckit's world."""

    world_size: int
    global_rank: int

    @property
    def root_device(self) -> torch.device:
        mine: torch.device = device()
        return mine

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class RayDDPStrategy(_OnHpckitRanks, DDPStrategy):
    """``DDPStrategy`` on hpckit's ranks."""


class RayFSDPStrategy(_OnHpckitRanks, FSDPStrategy):
    """``FSDPStrategy`` (Lightning's FSDP, which needs GPUs) on hpckit's ranks. With
    ``state_dict_type="sharded"`` every rank writes its shard into the report's checkpoint
    directory, which hpckit commits in place."""


class RayTrainReportCallback(Callback):
    """Saves the Lightning checkpoint (``checkpoint.ckpt``, written as the strategy writes it:
    by rank 0 for DDP) into this report's checkpoint directory and reports it with the
    metrics Lightning logged, plus ``epoch`` and ``step``.

    By default at the end of every training epoch, after validation, as Ray's callback does;
    ``every_n_epochs`` and ``every_n_train_steps`` change that. Every rank runs the same
    hooks, so every rank reports the same number of times. Resume with
    ``trainer.fit(model, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))``
    where ``d`` is ``hpckit.get_checkpoint()``'s directory: Lightning restores the epoch, the
    global step, the optimizers and the loops.

    Args:
        every_n_epochs: Report at the end of every this many training epochs, after
            validation (a whole number >= 0; 1, the default, every epoch; 0 never).
            hpckit's own (Ray: every epoch).
        every_n_train_steps: Also report after every this many optimizer steps (a whole
            number >= 0); None or 0 (the default) never. A step that ends an epoch that
            reports is reported once, after validation. hpckit's own.

    Raises:
        ConfigError: A value is not a whole number >= 0.
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self, every_n_epochs: int = 1, every_n_train_steps: int | None = None) -> None:
        super().__init__()
        for name, value in (("every_n_epochs", every_n_epochs),
                            ("every_n_train_steps", every_n_train_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ConfigError(f"RayTrainReportCallback({name}={value!r}) must be a whole "
                                  "number >= 0 (0 turns that trigger off)")
        self.every_n_epochs = every_n_epochs
        self.every_n_train_steps = every_n_train_steps or 0
        self._last_step: int | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        steps = self.every_n_train_steps
        if steps and trainer.global_step % steps == 0 and not (
                trainer.is_last_batch and self._epoch_due(trainer)):
            self._report(trainer)  # at an epoch's last batch, the epoch's report, after validation

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._epoch_due(trainer):
            self._report(trainer)

    def _epoch_due(self, trainer: pl.Trainer) -> bool:
        epochs = self.every_n_epochs
        return bool(epochs) and (trainer.current_epoch + 1) % epochs == 0

    def _report(self, trainer: pl.Trainer) -> None:
        if trainer.sanity_checking or self._last_step == trainer.global_step:
            return  # nothing trained since the last report (gradient accumulation, epoch end)
        self._last_step = trainer.global_step
        metrics = {name: _value(value) for name, value in trainer.callback_metrics.items()}
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step)
        directory = hpckit.get_context().get_checkpoint_dir()
        path = os.path.join(directory, self.CHECKPOINT_NAME)
        trainer.save_checkpoint(path)
        if trainer.is_global_zero and os.path.isfile(path):  # one file, rank 0's (DDP)
            claim(directory, self.CHECKPOINT_NAME)
        hpckit.report(metrics, checkpoint=Checkpoint.from_directory(directory))


def _value(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


def prepare_trainer(trainer: pl.Trainer) -> pl.Trainer:
    """Check that ``trainer`` runs one process per hpckit rank on hpckit's process group, and
    return it. hpckit starts the processes (or mpirun/srun does): Lightning must not.

    Args:
        trainer: A ``lightning.pytorch.Trainer`` made with ``strategy=RayDDPStrategy()`` (or
            ``RayFSDPStrategy()`` on GPUs), ``plugins=[RayLightningEnvironment()]`` and
            ``devices=1``.

    Returns:
        ``trainer`` itself.

    Raises:
        ConfigError: The Trainer has another strategy or cluster environment, or more than
            one device per process; the message says what to change.
    """
    strategy = trainer.strategy
    if not isinstance(strategy, (RayDDPStrategy, RayFSDPStrategy)):
        raise ConfigError(f"the Trainer's strategy is {type(strategy).__name__}, which would "
                          f"not use hpckit's ranks; make it {EXPECTED}")
    environment = strategy.cluster_environment
    if not isinstance(environment, RayLightningEnvironment):
        raise ConfigError(f"the Trainer's cluster environment is {type(environment).__name__}, "
                          "which would start or count processes itself; pass "
                          f"plugins=[RayLightningEnvironment()]: {EXPECTED}")
    if trainer.num_devices != 1:
        raise ConfigError(f"the Trainer has devices={trainer.num_devices} per process; hpckit "
                          "runs one process per device (ScalingConfig(num_workers, use_gpu)), so "
                          f"each needs devices=1 (or 'auto' on CPUs): {EXPECTED}")
    if trainer.checkpoint_callback is not None and trainer.is_global_zero:
        log.info("Lightning's own ModelCheckpoint is on too: it writes to %s as well, outside "
                 "the experiment; Trainer(enable_checkpointing=False) leaves checkpoints to "
                 "RayTrainReportCallback", trainer.default_root_dir)
    return trainer
