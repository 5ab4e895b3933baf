"""``prepare_trainer``: a Trainer that would fight hpckit is refused with what to change."""

from __future__ import annotations

import lightning.pytorch as pl

from hpckit.errors import ConfigError
from hpckit.integrations.lightning.environment import RayLightningEnvironment
from hpckit.integrations.lightning.strategy import RayDDPStrategy, RayFSDPStrategy
from hpckit.logs import log

EXPECTED = ("pl.Trainer(strategy=RayDDPStrategy() (or RayFSDPStrategy() on GPUs), "
            "plugins=[RayLightningEnvironment()], devices=1, "
            "callbacks=[RayTrainReportCallback()], ...), all from hpckit.lightning")


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
