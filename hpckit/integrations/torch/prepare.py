"""prepare_model and prepare_data_loader, with Ray 2.60's signatures: DDP or FSDP2 for the
model, and a loader that gives each rank its share and moves batches to the device."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
)

from hpckit.errors import ConfigError
from hpckit.integrations.torch import distributed as _distributed
from hpckit.integrations.torch.sharding import fully_sharded

PARALLEL_STRATEGIES = ("ddp", "fsdp", None)


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def prepare_model(model: torch.nn.Module, move_to_device: bool | torch.device = True,
                  parallel_strategy: str | None = "ddp",
                  parallel_strategy_kwargs: dict[str, Any] | None = None,
                  **ddp_kwargs: Any) -> torch.nn.Module:
    """Move ``model`` to this rank's device (or to ``move_to_device`` where it is a device)
    and, at world size > 1, wrap it in ``DistributedDataParallel`` (``"ddp"``), shard it
    with FSDP2's ``fully_shard`` (``"fsdp"``), or neither (``None``).

    ``parallel_strategy_kwargs`` go to DDP, or to ``fully_shard`` for every sharded module
    (see :func:`~hpckit.integrations.torch.sharding.fully_sharded`). Keywords beyond Ray's
    are DDP's, as in earlier hpckit releases."""
    if parallel_strategy not in PARALLEL_STRATEGIES:
        raise ConfigError(f"prepare_model(parallel_strategy={parallel_strategy!r}): give "
                          "'ddp', 'fsdp' or None, as in Ray.")
    if ddp_kwargs and parallel_strategy != "ddp":
        raise ConfigError(f"prepare_model(): {sorted(ddp_kwargs)} are DDP's keywords, but "
                          f"parallel_strategy={parallel_strategy!r}; pass the strategy's own "
                          "in parallel_strategy_kwargs.")
    kwargs = {**(parallel_strategy_kwargs or {}), **ddp_kwargs}
    device = (move_to_device if isinstance(move_to_device, torch.device)
              else _distributed.device())
    if move_to_device is not False:
        model = model.to(device)
    if _world_size() == 1 or parallel_strategy is None:
        return model
    if parallel_strategy == "fsdp":
        return fully_sharded(model, device, kwargs)
    if device.type == "cuda":
        kwargs = {"device_ids": [device.index], "output_device": device.index, **kwargs}
    return torch.nn.parallel.DistributedDataParallel(model, **kwargs)


def prepare_data_loader(loader: DataLoader, add_dist_sampler: bool = True,
                        move_to_device: bool = True, auto_transfer: bool = True) -> Any:
    """Give each rank its own share of ``loader``'s dataset, and move batches to the device.

    At world size > 1 the loader is rebuilt around a ``DistributedSampler`` (shuffling as
    the loader did), keeping every other argument it was given: its generator, prefetch
    factor, pin-memory device and the rest. Not for an ``IterableDataset``, a loader that
    already has a ``DistributedSampler``, or with ``add_dist_sampler=False``. The sampler's
    epoch advances each time the loader is iterated, unless you set it yourself
    (``loader.sampler.set_epoch(epoch)``, as Ray asks), which then wins. ``auto_transfer``
    is accepted for Ray's signature: batches move with non-blocking copies to a GPU either
    way. The loader's worker processes ignore SIGTERM: Slurm sends it to every process of
    the job step when it preempts the job, and the rank stops at its next report (the
    workers end with it), where a worker would die at once.
    """
    if not isinstance(loader.worker_init_fn, _IgnoringTerm):
        loader.worker_init_fn = _IgnoringTerm(loader.worker_init_fn)
    if (add_dist_sampler and _world_size() > 1
            and not isinstance(loader.sampler, DistributedSampler)
            and not isinstance(loader.dataset, IterableDataset)):
        loader = _with_sampler(loader)
    return _DeviceLoader(loader, _distributed.device() if move_to_device else None)


def _with_sampler(loader: DataLoader) -> DataLoader:
    """``loader`` again, over this rank's share: every argument kept but the sampler."""
    shuffle = not isinstance(loader.sampler, SequentialSampler)
    sampler: DistributedSampler = DistributedSampler(loader.dataset, shuffle=shuffle)
    kept = {name: getattr(loader, name) for name in (
        "batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout",
        "worker_init_fn", "multiprocessing_context", "generator", "persistent_workers",
        "pin_memory_device", "in_order")
        if hasattr(loader, name)}
    if loader.num_workers > 0:
        kept["prefetch_factor"] = loader.prefetch_factor
    return DataLoader(loader.dataset, sampler=sampler, **kept)


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
        self.set_by_us = getattr(loader.sampler, "epoch", 0)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        sampler = self.loader.sampler
        if isinstance(sampler, DistributedSampler):
            if sampler.epoch != self.set_by_us:
                self.epoch = sampler.epoch  # the user's set_epoch wins
            sampler.set_epoch(self.epoch)
            self.set_by_us = self.epoch
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
