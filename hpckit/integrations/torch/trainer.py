"""TorchTrainer: the trainer with a torch.distributed process group set up on every rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpckit.checkpoint import Checkpoint
from hpckit.config import RunConfig, ScalingConfig, ValidationConfig
from hpckit.errors import ConfigError
from hpckit.integrations.torch.config import TorchConfig
from hpckit.integrations.torch.distributed import TorchBackend
from hpckit.launch.trainer import DataParallelTrainer
from hpckit.run.job import Backend


class TorchTrainer(DataParallelTrainer):
    """Data-parallel PyTorch training on the ranks of an MPI job: every rank joins one
    torch.distributed process group (NCCL on GPUs with ``use_gpu``, Gloo on CPUs) and gets
    its device before the training function runs.

    Sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` on each rank, as Ray does, and on CPUs
    ``OMP_NUM_THREADS`` to the rank's threads. Ray's ``datasets``, ``dataset_config`` and
    ``metadata`` are not accepted.

    Args:
        train_loop_per_worker: As for :class:`~hpckit.DataParallelTrainer`.
        train_loop_config: As for :class:`~hpckit.DataParallelTrainer`.
        torch_config: The process group's back-end and timeout; None (the default) is
            ``TorchConfig()``: NCCL with ``use_gpu``, else Gloo, 30 minutes. A second
            ``fit()`` in the same process keeps the first one's process group.
        scaling_config: As for :class:`~hpckit.DataParallelTrainer`.
        run_config: As for :class:`~hpckit.DataParallelTrainer`.
        resume_from_checkpoint: As for :class:`~hpckit.DataParallelTrainer`.
        validation_config: As for :class:`~hpckit.DataParallelTrainer`.

    Raises:
        ConfigError: As for :class:`~hpckit.DataParallelTrainer`, or ``torch_config`` is
            not a ``TorchConfig``.
    """

    def __init__(self, train_loop_per_worker: Callable[..., Any], *,
                 train_loop_config: dict[str, Any] | None = None,
                 torch_config: TorchConfig | None = None,
                 scaling_config: ScalingConfig | None = None,
                 run_config: RunConfig | None = None,
                 resume_from_checkpoint: Checkpoint | None = None,
                 validation_config: ValidationConfig | None = None) -> None:
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise ConfigError(f"TorchTrainer(torch_config={torch_config!r}) must be a TorchConfig.")
        self.torch_config = torch_config or TorchConfig()
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         scaling_config=scaling_config, run_config=run_config,
                         resume_from_checkpoint=resume_from_checkpoint,
                         validation_config=validation_config)

    def _backend(self) -> Backend:
        return TorchBackend(self.torch_config)
