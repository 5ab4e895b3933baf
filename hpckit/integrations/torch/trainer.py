"""TorchTrainer: the trainer with a torch.distributed process group set up on every rank."""

from __future__ import annotations

from hpckit.integrations.torch.distributed import TorchBackend
from hpckit.launch.trainer import DataParallelTrainer
from hpckit.run.job import Backend


class TorchTrainer(DataParallelTrainer):
    """Data-parallel PyTorch training on the ranks of an MPI job: every rank joins one
    torch.distributed process group (NCCL on GPUs with ``use_gpu``, Gloo on CPUs) and gets
    its device before the training function runs."""

    def _backend(self) -> Backend:
        return TorchBackend()
