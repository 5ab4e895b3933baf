"""Lightning's DDP and FSDP on hpckit's process group and devices."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

from hpckit.integrations.torch.distributed import device


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
