"""The loader ``prepare_data_loader`` returns: batches moved to the rank's device, the
sampler's epoch advanced at each pass, and its position kept for an exact resume (a keeper
of :mod:`hpckit.run.session.resumable`).

A pass cut by a checkpoint (the training loop still iterating it at ``report()``) is
continued on resume; a pass the program abandoned (``break``, then a new ``iter()``) is not,
as the uninterrupted run would start a new one. To continue a cut pass the loader is made
again as it was made at the pass's start: the random streams and the loader's own generator
set back to what they were then (an ``IterableDataset`` that shuffles in ``__iter__`` draws
the same order again), then torchdata's ``StatefulDataLoader`` restores its position
without reading the batches before (its sampler, worker and seed state; a dataset's own
``state_dict`` where it has one), or the batches before are read and dropped. Then the
streams and the generator are put back as the checkpoint left them. A saved position that
cannot be put back (another ``num_workers``, another dataset length) is said in one warning
naming what changed and where the pass goes on.

torch's random streams as a keeper of :mod:`hpckit.run.session.resumable`: the CPU
generator, and each CUDA device's where this process has started CUDA (asking would start
it on every visible device). ``TorchTrainer``'s back-end has them kept, with Python's and
NumPy's (:func:`random_keepers`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from hpckit.logs import log
from hpckit.run.session import resumable


class PreparedLoader:
    def __init__(self, loader: DataLoader, device: torch.device | None, name: str = "") -> None:
        self.loader = loader
        self.device = device
        self.name = name  # as the resume state calls it: loader-0 for the first prepared
        self.epoch = 0  # the sampler's epoch for the next pass, unless the user sets one
        self.set_by_us = getattr(loader.sampler, "epoch", 0)
        self.consumed = 0  # batches of the current pass handed out
        self.finished = True  # no pass under way (ended, or abandoned by the program)
        self._started: dict[str, Any] | None = None  # the streams as the pass began
        self._continue: dict[str, Any] | None = None  # the saved state of a pass to continue

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        if self._continue is not None:
            saved, self._continue = self._continue, None
            batches = self._continued(saved)
        else:
            self._next_epoch()
            self._started = self._streams()
            batches, self.consumed = iter(self.loader), 0
        self.finished = False
        try:
            for batch in batches:
                self.consumed += 1
                yield batch if self.device is None else to_device(batch, self.device)
        finally:  # ran out, or the program let go of the pass (break, a new iter())
            self.finished = True

    def _next_epoch(self) -> None:
        sampler = self.loader.sampler
        if isinstance(sampler, DistributedSampler):
            if sampler.epoch != self.set_by_us:
                self.epoch = sampler.epoch  # the user's set_epoch wins
            sampler.set_epoch(self.epoch)
            self.set_by_us = self.epoch
        self.epoch += 1

    def _generators(self) -> list[torch.Generator]:
        """The loader's own generators: the one it was given, and its sampler's where that
        is another (torchdata's shuffling sampler seeds one of its own when made)."""
        found: list[torch.Generator] = []
        for holder in (self.loader, self.loader.sampler,
                       getattr(self.loader.batch_sampler, "sampler", None)):
            generator = getattr(holder, "generator", None)
            if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
                found.append(generator)
        return found

    def _generator_states(self) -> list[torch.Tensor]:
        return [generator.get_state() for generator in self._generators()]

    def _set_generators(self, states: list[torch.Tensor] | None) -> None:
        generators = self._generators()
        if states is not None and len(states) == len(generators):
            for generator, state in zip(generators, states, strict=True):
                generator.set_state(state)

    def _streams(self) -> dict[str, Any]:
        return {"process": random_snapshot(), "generators": self._generator_states()}

    def _set_streams(self, state: dict[str, Any]) -> None:
        put_back_random(state["process"])
        self._set_generators(state["generators"])

    def _continued(self, saved: dict[str, Any]) -> Iterator[Any]:
        """The cut pass's remaining batches, the loader made again as at the pass's start;
        the random streams and the generator then as the checkpoint left them."""
        now = self._streams()
        self._started = saved["started"]
        if self._started is not None:
            self._set_streams(self._started)
        batches, restored = self._restored(saved)
        if not restored:
            for _ in range(self.consumed):
                next(batches, None)
        self._set_streams(now)
        return batches

    def _restored(self, saved: dict[str, Any]) -> tuple[Iterator[Any], bool]:
        """An iterator at the saved position where torchdata can put it back; else one at
        the pass's start, whose first ``consumed`` batches the caller drops."""
        changed = self._what_changed(saved)
        if (changed is None and saved["loader"] is not None
                and isinstance(self.loader, StatefulDataLoader)):
            try:
                self.loader.load_state_dict(saved["loader"])
                with _quiet_fast_forward():
                    return iter(self.loader), True
            except Exception as exc:  # noqa: BLE001  (torchdata refuses with assertions)
                changed = f"torchdata refused it ({type(exc).__name__}: {exc})"
                self.loader.load_state_dict({})
        if changed is not None:
            log.warning("%s: the position saved with the checkpoint cannot be put back as "
                        "it was (%s): the cut pass goes on at batch %d by reading and "
                        "dropping the %d batch(es) before it, and the random streams of "
                        "its loader workers may differ from the uninterrupted run's",
                        self.name or "a prepared loader", changed, self.consumed + 1,
                        self.consumed)
        return iter(self.loader), False

    def _what_changed(self, saved: dict[str, Any]) -> str | None:
        """What differs between the loader that saved the position and this one."""
        workers = getattr(self.loader, "num_workers", 0)
        if saved.get("num_workers", workers) != workers:
            return f"it was saved with num_workers={saved['num_workers']}, this loader has {workers}"
        return None

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
        cut = not self.finished
        return {"epoch": self.epoch, "set_by_us": self.set_by_us, "consumed": self.consumed,
                "finished": self.finished,
                "sampler_epoch": sampler.epoch if isinstance(sampler, DistributedSampler) else None,
                "generators": self._generator_states(),
                "num_workers": getattr(self.loader, "num_workers", 0),
                "length": _length(self.loader),
                "started": self._started if cut else None,
                "loader": (self.loader.state_dict()
                           if cut and isinstance(self.loader, StatefulDataLoader) else None)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.set_by_us = state["epoch"], state["set_by_us"]
        self.consumed, self.finished = state["consumed"], state["finished"]
        if state["sampler_epoch"] is not None and isinstance(self.loader.sampler, DistributedSampler):
            self.loader.sampler.set_epoch(state["sampler_epoch"])
        self._set_generators(state.get("generators"))
        self._continue = None
        if self.finished:
            return
        length = _length(self.loader)
        if state.get("length") is not None and length is not None and state["length"] != length:
            log.warning("%s: the position saved with the checkpoint is in a pass of %d "
                        "batch(es), and this loader's passes have %d (its dataset or batch "
                        "size changed): the next pass starts afresh",
                        self.name or "a prepared loader", state["length"], length)
            self.finished, self.consumed = True, 0
            return
        self._continue = {"loader": state.get("loader"), "started": state.get("started"),
                          "num_workers": state.get("num_workers",
                                                   getattr(self.loader, "num_workers", 0))}


@contextlib.contextmanager
def _quiet_fast_forward() -> Iterator[None]:
    """torchdata warns, on every rank, that it reads an IterableDataset's batches again to
    reach the saved position: that is how the cut pass is continued here, said in the
    docs, not a fault of the program."""
    logger = logging.getLogger("torchdata.stateful_dataloader.stateful_dataloader")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _length(loader: DataLoader) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an IterableDataset without __len__
        return None


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


class TorchRandom:
    def state_dict(self) -> dict[str, Any]:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return {"cpu": torch.get_rng_state(), "cuda": cuda}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["cpu"])
        cuda = state["cuda"]
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def random_keepers() -> dict[str, Any]:
    """The random streams a torch run keeps with each checkpoint: Python's, NumPy's, torch's."""
    return {"random": resumable.PythonRandom(), "torch": TorchRandom()}


def random_snapshot() -> list[Any]:
    """The process's random streams now."""
    return [keeper.state_dict() for keeper in random_keepers().values()]


def put_back_random(states: list[Any]) -> None:
    """The process's random streams as ``random_snapshot()`` found them."""
    for keeper, state in zip(random_keepers().values(), states, strict=True):
        keeper.load_state_dict(state)
