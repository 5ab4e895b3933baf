"""prepare_model and prepare_data_loader: DDP and sharded, device-placed data."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from hpckit.integrations.torch import distributed as _distributed


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def prepare_model(model: torch.nn.Module, **ddp_kwargs: Any) -> torch.nn.Module:
    """Move ``model`` to this rank's device and wrap it in DDP (unwrapped at world size 1)."""
    device = _distributed.device()
    model = model.to(device)
    if _world_size() == 1:
        return model
    if device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [device.index])
        ddp_kwargs.setdefault("output_device", device.index)
    return torch.nn.parallel.DistributedDataParallel(model, **ddp_kwargs)


def prepare_data_loader(loader: DataLoader, move_to_device: bool = True) -> Iterator[Any]:
    """Give each rank its own share of ``loader``'s dataset, and move batches to the device.

    The sampler's epoch advances each time the loader is iterated, so every epoch shuffles
    differently while all ranks agree on the order. Its worker processes ignore SIGTERM:
    Slurm sends it to every process of the job step when it preempts the job, and the rank
    stops at its next report (the workers end with it), where a worker would die at once.
    """
    if not isinstance(loader.worker_init_fn, _IgnoringTerm):
        loader.worker_init_fn = _IgnoringTerm(loader.worker_init_fn)
    if _world_size() > 1 and not isinstance(loader.sampler, DistributedSampler):
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler: DistributedSampler = DistributedSampler(loader.dataset, shuffle=shuffle)
        loader = DataLoader(
            loader.dataset, batch_size=loader.batch_size, sampler=sampler,
            num_workers=loader.num_workers, collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory, drop_last=loader.drop_last,
            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            persistent_workers=loader.persistent_workers)
    return _DeviceLoader(loader, _distributed.device() if move_to_device else None)


class _IgnoringTerm:
    """A DataLoader's ``worker_init_fn`` that first sets SIGTERM aside (picklable, for the
    spawn start method)."""

    def __init__(self, init: Callable[[int], None] | None) -> None:
        self.init = init

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.init is not None:
            self.init(worker_id)


class _DeviceLoader:
    def __init__(self, loader: DataLoader, device: torch.device | None) -> None:
        self.loader = loader
        self.device = device
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        sampler = self.loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(self.epoch)
        self.epoch += 1
        for batch in self.loader:
            yield batch if self.device is None else _to(batch, self.device)


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [_to(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch
