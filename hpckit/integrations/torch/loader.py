"""The loader ``prepare_data_loader`` returns: batches moved to the rank's device, the
sampler's epoch advanced at each pass, and its position kept for an exact resume (a keeper
of :mod:`hpckit.run.session.resumable`). A loader rebuilt as torchdata's
``StatefulDataLoader`` continues a pass where it stopped without reading the batches before
(its sampler, worker and seed state restored); any other continues by reading and dropping
them. Either way the random streams are put back as they were after the continued pass's
start, as if it had never been interrupted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from hpckit.integrations.torch import streams


class PreparedLoader:
    def __init__(self, loader: DataLoader, device: torch.device | None) -> None:
        self.loader = loader
        self.device = device
        self.epoch = 0  # the sampler's epoch for the next pass, unless the user sets one
        self.set_by_us = getattr(loader.sampler, "epoch", 0)
        self.consumed = 0  # batches of the current pass handed out
        self.finished = True  # no pass under way
        self._continue = False  # the next pass continues one that a checkpoint cut

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        if self._continue:
            self._continue = False
            batches = self._continued()
        else:
            self._next_epoch()
            batches, self.consumed = iter(self.loader), 0
        self.finished = False
        for batch in batches:
            self.consumed += 1
            yield batch if self.device is None else to_device(batch, self.device)
        self.finished = True

    def _next_epoch(self) -> None:
        sampler = self.loader.sampler
        if isinstance(sampler, DistributedSampler):
            if sampler.epoch != self.set_by_us:
                self.epoch = sampler.epoch  # the user's set_epoch wins
            sampler.set_epoch(self.epoch)
            self.set_by_us = self.epoch
        self.epoch += 1

    def _continued(self) -> Iterator[Any]:
        """The cut pass's remaining batches; the random streams as the checkpoint left them."""
        before = streams.snapshot()
        batches = iter(self.loader)
        if not isinstance(self.loader, StatefulDataLoader):
            for _ in range(self.consumed):
                next(batches, None)
        streams.put_back(before)
        return batches

    def close(self) -> None:
        """End the worker processes of a pass left unfinished (a ``StatefulDataLoader``
        keeps its iterator, and with it the workers, to say where it is)."""
        iterator = getattr(self.loader, "_iterator", None)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        if iterator is not None:
            setattr(self.loader, "_iterator", None)  # noqa: B010  (torchdata's own field)

    def state_dict(self) -> dict[str, Any]:
        sampler = self.loader.sampler
        generator = self.loader.generator
        return {"epoch": self.epoch, "set_by_us": self.set_by_us, "consumed": self.consumed,
                "finished": self.finished,
                "sampler_epoch": sampler.epoch if isinstance(sampler, DistributedSampler) else None,
                "generator": generator.get_state() if generator is not None else None,
                "loader": (self.loader.state_dict()
                           if isinstance(self.loader, StatefulDataLoader) else None)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.set_by_us = state["epoch"], state["set_by_us"]
        self.consumed, self.finished = state["consumed"], state["finished"]
        if state["sampler_epoch"] is not None and isinstance(self.loader.sampler, DistributedSampler):
            self.loader.sampler.set_epoch(state["sampler_epoch"])
        if state["generator"] is not None and self.loader.generator is not None:
            self.loader.generator.set_state(state["generator"])
        if (not self.finished and state["loader"] is not None
                and isinstance(self.loader, StatefulDataLoader)):
            self.loader.load_state_dict(state["loader"])
        self._continue = not self.finished


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch
