"""Lightning's DDP on hpckit's process group and devices."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy

from hpckit.integrations.torch.distributed import device


class RayDDPStrategy(DDPStrategy):
    """``DDPStrategy`` whose device is the one hpckit gave this rank and whose samplers
    split the data over hpckit's world."""

    @property
    def root_device(self) -> torch.device:
        mine: torch.device = device()
        return mine

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}
